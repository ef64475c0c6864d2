"""`vgpulimit completion bash|zsh` and `--version`, as a shell user meets them:
the script is loaded into a real bash (and zsh, where installed) and its
function is asked what follows the words typed so far."""

from __future__ import annotations

import shlex
import subprocess
from importlib.metadata import version

import pytest
from conftest import base_env, have
from helpers import vgpulimit


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory):
    result = vgpulimit("completion", "bash")
    assert result.returncode == 0, result.stderr
    path = tmp_path_factory.mktemp("completion") / "vgpulimit.bash"
    path.write_text(result.stdout)
    return path


def complete(shell: str, script, words: list[str], cwd=None) -> list[str]:
    """What the completion function offers for the last of ``words`` (the word
    under the cursor, '' for a fresh one), as the shell would call it."""
    call = (f"COMP_WORDS=({' '.join(map(shlex.quote, words))}); "
            f"COMP_CWORD={len(words) - 1}; COMPREPLY=(); _vgpulimit; "
            "printf '%s\\n' \"${COMPREPLY[@]}\"")
    if shell == "zsh":
        # As bashcompinit's compgen -F calls it: sh emulation, arrays from 0.
        program = ("autoload -U compinit && compinit -u; "
                   f"source {shlex.quote(str(script))}; "
                   f"() {{ emulate -L sh; setopt kshglob noshglob braceexpand; {call} }}")
        cmd = ["zsh", "-f", "-c", program]
    else:
        cmd = ["bash", "--norc", "-c", f"source {shlex.quote(str(script))}; {call}"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd,
                            env=base_env(), timeout=60)
    assert result.returncode == 0 and result.stderr == "", result
    return [line for line in result.stdout.splitlines() if line]


def test_the_bash_script_is_valid_bash(bash_script):
    result = subprocess.run(["bash", "-n", str(bash_script)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr


def test_bash_completes_a_command(bash_script):
    assert complete("bash", bash_script, ["vgpulimit", "sta"]) == ["status"]
    assert "completion" in complete("bash", bash_script, ["vgpulimit", ""])
    assert complete("bash", bash_script, ["vgpulimit", "cdi", "gen"]) == ["generate"]


def test_bash_completes_the_flags_of_the_command_typed(bash_script):
    assert complete("bash", bash_script, ["vgpulimit", "run", "--mem"]) == \
        ["--memory", "--memory-device", "--memory-units", "--memory-request", "--memory-request-device",
         "--memory-wait"]
    # status has no --memory; a flag's value is not taken for a command.
    assert complete("bash", bash_script, ["vgpulimit", "status", "--mem"]) == []
    assert complete("bash", bash_script, ["vgpulimit", "run", "--memory", "4GiB", "--co"]) == \
        ["--cores", "--cores-device", "--cores-policy"]
    assert complete("bash", bash_script, ["vgpulimit", "cdi", "generate", "--out"]) == ["--output"]
    assert complete("bash", bash_script, ["vgpulimit", "--ver"]) == ["--version"]


def test_bash_completes_a_flags_value_and_offers_nothing_for_a_size(bash_script):
    assert complete("bash", bash_script, ["vgpulimit", "set", "--cores-policy", "b"]) == ["borrow"]
    # --cores-policy=b: bash splits it at the '='.
    assert complete("bash", bash_script,
                    ["vgpulimit", "run", "--cores-policy", "=", "h"]) == ["hard"]
    assert complete("bash", bash_script, ["vgpulimit", "completion", ""]) == ["bash", "zsh"]
    assert complete("bash", bash_script, ["vgpulimit", "run", "--memory", ""]) == []


def test_bash_completes_directories_and_the_command_to_run(bash_script, tmp_path):
    (tmp_path / "regions").mkdir()
    (tmp_path / "regular").write_text("")
    assert complete("bash", bash_script, ["vgpulimit", "status", "--all", "reg"], cwd=tmp_path) == \
        ["regions"]
    assert "bash" in complete("bash", bash_script, ["vgpulimit", "run", "--", "bas"])
    assert complete("bash", bash_script, ["vgpulimit", "run", "--", "cat", "regu"], cwd=tmp_path) \
        == ["regular"]


@pytest.mark.skipif(not have("zsh"), reason="zsh is not installed")
def test_zsh_runs_the_same_completion(tmp_path):
    result = vgpulimit("completion", "zsh")
    assert result.returncode == 0, result.stderr
    script = tmp_path / "vgpulimit.zsh"
    script.write_text(result.stdout)
    # zsh's compgen offers every word; zsh itself then keeps those that match.
    assert "status" in complete("zsh", script, ["vgpulimit", "sta"])
    offered = complete("zsh", script, ["vgpulimit", "run", "--mem"])
    assert "--memory-units" in offered and "--json" not in offered
    assert complete("zsh", script, ["vgpulimit", "run", "--cores-policy", "b"]) == \
        ["hard", "borrow", "none"]


def test_an_unknown_shell_is_one_line_naming_the_shells():
    result = vgpulimit("completion", "fish")
    assert result.returncode == 2 and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("vgpulimit: error: ") and "'bash', 'zsh'" in line


def test_version_is_the_packages():
    result = vgpulimit("--version")
    assert (result.returncode, result.stdout) == (0, f"vgpulimit {version('vgpulimit')}\n")
