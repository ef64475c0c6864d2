"""The JSON Schemas in tests/data/schemas (CDI; OCI runtime config and state;
their sources in its README), for tests that check what we write or read
against them.  A test that validates validates, or skips saying why: where
jsonschema is absent nothing passes having checked nothing.  Helpers that make documents for other tests do not validate them
on the side; one test per helper validates what it makes."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

SCHEMAS = Path(__file__).resolve().parent / "data" / "schemas"


@cache
def _validator(name: str):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is a test dependency")
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT4, DRAFT7

    path = SCHEMAS / name
    schema = json.loads(path.read_text())
    default = DRAFT7 if "draft-07" in schema.get("$schema", "") else DRAFT4

    def retrieve(uri: str) -> Resource:
        # $refs name files beside the schema ("defs.json#/definitions/...").
        return Resource.from_contents(json.loads((path.parent / uri).read_text()),
                                      default_specification=default)

    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=Registry(retrieve=retrieve))


def validate(name: str, document: Any) -> None:
    """Fails the test with the schema's complaint if ``document`` does not
    validate against ``SCHEMAS/name``."""
    errors = sorted(_validator(name).iter_errors(document), key=str)
    assert not errors, f"{name}: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5])
