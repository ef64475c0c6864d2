"""Where the shim loads: every glibc from 2.17 on, on x86_64 and on aarch64
(NVIDIA's Grace nodes); the simulated driver and the cffi module that ship
with it hold to the same floor.

The version needs are read from the built shim with readelf, as the dynamic
loader checks them.  The aarch64 build is made with cross/aarch64-linux-gnu.ini
(branch protection on, BTI forced) and run under qemu-aarch64, which enforces
BTI on the shim's pages: where the shim is entered by an indirect branch
without a landing pad, the process dies with SIGILL."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import C_DIR, ROOT, GiB, MiB, base_env, compile_c, have, run
from test_core import CORE_SOURCES, CORE_TESTS, exported, hooked_names

GLIBC_FLOOR = (2, 17)
CROSS_FILE = ROOT / "cross" / "aarch64-linux-gnu.ini"
CROSS_CC = "aarch64-linux-gnu-gcc"
CROSS_SYSROOT = Path("/usr/aarch64-linux-gnu")
QEMU = ["qemu-aarch64", "-L", str(CROSS_SYSROOT)]
# What glibc < 2.34 keeps out of libc.so.6: dlopen and the like, robust mutexes.
OLD_GLIBC_LIBRARIES = {"libdl.so.2", "libpthread.so.0"}
# The dynamic loader, which thread-local variables in a shared library need
# (__tls_get_addr); its version names are held to the same floor.
LOADERS = {"ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1"}
# Only a dead process's robust mutex being handed on needs set_robust_list.
ROBUST_MUTEX_TESTS = {"dead_holders", "kill_storm"}
QEMU_HAS_NO_ROBUST_LISTS = ("recovery from a dead lock holder needs the kernel to hand on its robust "
                            "mutex, and qemu-user has no set_robust_list (ENOSYS)")


def readelf(path: Path, *args: str) -> str:
    return subprocess.run(["readelf", "-W", *args, str(path)], capture_output=True, text=True,
                          check=True).stdout


def version_needs(path: Path) -> dict[str, list[str]]:
    """Library -> the version names needed of it (readelf -V)."""
    needs: dict[str, list[str]] = {}
    library = None
    for line in readelf(path, "-V").split("Version needs section", 1)[-1].splitlines():
        if m := re.search(r"File: (\S+)", line):
            library = m[1]
            needs[library] = []
        elif (m := re.search(r"Name: (\S+)", line)) and library:
            needs[library].append(m[1])
    return needs


def glibc_release(name: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", name)
    return (int(m[1]), int(m[2])) if m else None


def assert_loads_on_glibc_2_17(library: Path, old_libraries=OLD_GLIBC_LIBRARIES) -> None:
    """``old_libraries``: where the functions it uses lived before glibc 2.34,
    which it must name as needed for a loader of then to load them."""
    needs = version_needs(library)
    assert needs, "readelf shows no version needs at all"
    assert set(needs) <= {"libc.so.6"} | OLD_GLIBC_LIBRARIES | LOADERS, needs
    names = [name for names in needs.values() for name in names]
    too_new = [name for name in names
               if glibc_release(name) is None or glibc_release(name) > GLIBC_FLOOR]
    assert too_new == [], f"{library.name} needs more than glibc {GLIBC_FLOOR}: {needs}"
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", readelf(library, "-d"))
    assert old_libraries <= set(needed), needed


# What each library the wheel ships needs of glibc < 2.34 beyond libc.so.6.
# simgpu calls no dl* function; the cffi module is loaded by a Python that has
# libpthread already.
SHIPPED_OLD_LIBRARIES = {
    "libvgpulimit.so": OLD_GLIBC_LIBRARIES,
    "libcuda.so.1": {"libpthread.so.0"},
    "libnvidia-ml.so.1": {"libpthread.so.0"},
}


# -- the shim as installed here ------------------------------------------------------------------


@pytest.mark.skipif(not have("readelf"), reason="binutils (readelf) is not installed")
def test_the_installed_shim_needs_glibc_2_17_at_most(shim_path):
    assert_loads_on_glibc_2_17(shim_path)


@pytest.mark.skipif(not have("readelf"), reason="binutils (readelf) is not installed")
def test_every_library_the_package_ships_needs_glibc_2_17_at_most(shim_path):
    """The simulated driver and the cffi module too: one manylinux2014 wheel."""
    package = shim_path.parent.parent
    libraries = sorted(p for p in package.rglob("*.so*") if p.is_file())
    names = [p.name for p in libraries]
    assert set(SHIPPED_OLD_LIBRARIES) <= set(names), names
    assert any(name.startswith("_core.") for name in names), names
    for library in libraries:
        assert_loads_on_glibc_2_17(library, SHIPPED_OLD_LIBRARIES.get(library.name, set()))


@pytest.mark.skipif(not have("readelf"), reason="binutils (readelf) is not installed")
def test_the_hook_reads_versions_as_readelf_and_the_running_libc_say_them(shim_path):
    from vgpulimit import glibc

    assert sorted(glibc.needed(shim_path.read_bytes())) == \
        sorted(name for names in version_needs(shim_path).values() for name in names)
    with open("/proc/self/maps", encoding="ascii") as maps:
        libc = next(Path(line.split()[-1]) for line in maps
                    if line.rstrip().endswith("/libc.so.6"))
    running = os.confstr("CS_GNU_LIBC_VERSION")   # "glibc 2.36"
    assert glibc.newest(glibc.defined(libc.read_bytes())) == \
        tuple(int(part) for part in running.split()[1].split("."))


# -- aarch64, cross-built and run under qemu -----------------------------------------------------


def aarch64_unavailable() -> str | None:
    tools = [CROSS_CC, "qemu-aarch64", "readelf", "nm", "meson", "ninja"]
    missing = [tool for tool in tools if not have(tool)]
    if not (CROSS_SYSROOT / "lib" / "libc.so.6").is_file():
        missing.append(f"{CROSS_SYSROOT}/lib/libc.so.6")
    if missing:
        return (f"{', '.join(missing)} not found: .ci/run installs gcc-aarch64-linux-gnu, "
                "libc6-dev-arm64-cross and qemu-user with apt-get when run as root")
    return None


@pytest.fixture(scope="module")
def aarch64(tmp_path_factory) -> dict[str, Path]:
    """The shim and simgpu cross-built with the repository's cross file, and the
    C clients built for aarch64 against them."""
    reason = aarch64_unavailable()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("aarch64")
    build = base / "build"
    for cmd in (["meson", "setup", str(build), str(ROOT), "-Dwerror=true", "--cross-file", str(CROSS_FILE)],
                ["ninja", "-C", str(build)]):
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = base / "bin"
    out.mkdir()
    (out / "libcuda.so").symlink_to(build / "simgpu" / "libcuda.so.1")
    compile_c(out / "alloc_client", [C_DIR / "alloc_client.c"], f"-L{out}", "-lcuda", "-ldl",
              cc=CROSS_CC)
    compile_c(out / "librtld_next_base.so", [C_DIR / "rtld_next_base.c"], "-shared", "-fPIC",
              cc=CROSS_CC)
    compile_c(out / "librtld_next_wrap.so", [C_DIR / "rtld_next_wrap.c"], "-shared", "-fPIC",
              "-ldl", cc=CROSS_CC)
    compile_c(out / "rtld_next_main", [C_DIR / "rtld_next_main.c"], "-Wl,--no-as-needed",
              f"-L{out}", "-lrtld_next_wrap", "-lrtld_next_base", "-ldl", f"-Wl,-rpath,{out}",
              cc=CROSS_CC)
    for program in CORE_TESTS:
        compile_c(out / program, [C_DIR / f"{program}.c", *CORE_SOURCES], "-lpthread", cc=CROSS_CC)
    return {"build": build, "bin": out, "shim": build / "shim" / "libvgpulimit.so",
            "simgpu": build / "simgpu"}


def under_qemu(aarch64, tmp_path, cmd, shim=True, **env) -> subprocess.CompletedProcess:
    # The loader's variables go to the emulated program alone (-E): in qemu's
    # own environment the host's loader would try to preload an aarch64 library.
    guest = ["-E", f"LD_LIBRARY_PATH={aarch64['simgpu']}"]
    if shim:
        guest += ["-E", f"LD_PRELOAD={aarch64['shim']}"]
    environment = base_env(SIMGPU_STATE=str(tmp_path / "simgpu.state"),
                           SIMGPU_CONTEXT_OVERHEAD="0", **env)
    return run([*QEMU, *guest, *map(str, cmd)], environment, check=False)


def test_qemu_enforces_bti_on_a_marked_library(aarch64, tmp_path):
    """Without this, the tests below could pass on a qemu that ignores BTI."""
    (tmp_path / "main.c").write_text("int entry(void);\nint main(void) { return entry(); }\n")
    for name, pad in (("pad", "hint #34\n"), ("nopad", "")):
        source = tmp_path / f"{name}.S"
        source.write_text(".text\n.globl entry\n.type entry, %function\nentry:\n" + pad +
                          "mov x0, #7\nret\n.size entry, .-entry\n"
                          '.section .note.GNU-stack, "", %progbits\n')
        library = tmp_path / name / "libentry.so"
        library.parent.mkdir()
        compile_c(library, [source], "-shared", "-nostartfiles", "-Wl,-z,force-bti",
                  "-Wl,--no-fatal-warnings", cc=CROSS_CC)
        compile_c(tmp_path / name / "main", [tmp_path / "main.c"], f"-L{library.parent}",
                  "-lentry", f"-Wl,-rpath,{library.parent}", cc=CROSS_CC)
    assert run([*QEMU, tmp_path / "pad" / "main"], base_env(), check=False).returncode == 7
    # Entered through the PLT's `br x17` with no landing pad: SIGILL.
    died = run([*QEMU, tmp_path / "nopad" / "main"], base_env(), check=False)
    assert died.returncode in (-4, 128 + 4), died


def test_the_aarch64_shim_is_bti_marked_by_every_object_of_its_own(aarch64):
    assert "AArch64 feature: BTI" in readelf(aarch64["shim"], "-n")
    # The linker keeps a marking only when every input has it; -z force-bti
    # makes up for the toolchain's unmarked libraries (libgcc.a, libc_nonshared.a),
    # so that a toolchain whose start files are marked keeps the shim marked.
    objects = sorted((aarch64["build"] / "shim").glob("*.p/*.o"))
    assert any(o.name == "src_dlsym_aarch64.S.o" for o in objects)
    unmarked = [o.name for o in objects
                if "AArch64 feature: BTI, PAC" not in readelf(o, "-n")]
    assert unmarked == []


def test_the_aarch64_shim_needs_glibc_2_17_at_most(aarch64):
    assert_loads_on_glibc_2_17(aarch64["shim"])


@pytest.mark.parametrize("name", ["libcuda.so.1", "libnvidia-ml.so.1"])
def test_the_aarch64_simgpu_needs_glibc_2_17_at_most(aarch64, name):
    assert_loads_on_glibc_2_17(aarch64["simgpu"] / name, SHIPPED_OLD_LIBRARIES[name])


def test_the_aarch64_shim_exports_only_its_hooks_and_dlsym(aarch64):
    assert exported(aarch64["shim"]) == hooked_names() | {"dlsym"}


@pytest.mark.parametrize("mode", ["link", "procaddr", "procaddr-ptds", "dlsym"])
def test_aarch64_every_lookup_path_stops_at_the_cap(aarch64, tmp_path, mode):
    result = under_qemu(aarch64, tmp_path,
                        [aarch64["bin"] / "alloc_client", mode, str(256 * MiB), "5"],
                        VGPULIMIT_MEMORY="1GiB", CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp_path / "region"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"meminfo {GiB} {GiB}", f"total {GiB}", *[f"alloc {i} 0" for i in range(4)], "alloc 4 2",
        f"meminfo 0 {GiB}", "free 0", "realloc 0"]


def test_aarch64_rtld_next_lookups_behave_as_without_the_shim(aarch64, tmp_path):
    program = [aarch64["bin"] / "rtld_next_main"]
    expected = under_qemu(aarch64, tmp_path, program, shim=False)
    assert expected.returncode == 0, expected.stderr
    assert expected.stdout.startswith("whoami 101\n")
    for extra in ({}, {"VGPULIMIT_MEMORY": "1GiB",
                       "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(tmp_path / "region")}):
        result = under_qemu(aarch64, tmp_path, program, **extra)
        assert (result.returncode, result.stdout) == (0, expected.stdout), result.stderr


@pytest.mark.parametrize("test", ["parser", "start_time", "region_files", "racing",
                                  *sorted(ROBUST_MUTEX_TESTS)])
def test_aarch64_core(aarch64, tmp_path, test):
    if test in ROBUST_MUTEX_TESTS:
        pytest.skip(QEMU_HAS_NO_ROBUST_LISTS)
    [program] = [p for p, tests in CORE_TESTS.items() if test in tests]
    result = under_qemu(aarch64, tmp_path, [aarch64["bin"] / program, tmp_path, test],
                        shim=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.fullmatch(r"[1-9]\d* passed, 0 failed\n", result.stdout), result.stdout

