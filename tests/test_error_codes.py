"""The one table of error codes (clients/python/src/ledgerdash_client/errorcodes.py) against what is
built from it: the ledger's errors, the API's statuses and OpenAPI enum, and
the Python client's exception classes."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from django.test import Client

import ledgerdash.ledger
import ledgerdash_client as client
from ledgerdash.ledger import errors
from ledgerdash.ledger.api import errors as api_errors
from ledgerdash_client import errorcodes


def _ledger_errors() -> list[type[errors.LedgerError]]:
    """Every LedgerError class, wherever in the ledger it is defined."""
    for module in pkgutil.walk_packages(ledgerdash.ledger.__path__, "ledgerdash.ledger."):
        if ".migrations" not in module.name and ".management" not in module.name:
            importlib.import_module(module.name)
    found: list[type[errors.LedgerError]] = [errors.LedgerError]
    for cls in found:
        found.extend(cls.__subclasses__())
    return found


LEDGER_ERRORS = _ledger_errors()


def test_every_ledger_error_has_a_row() -> None:
    missing = {cls.__name__: cls.code for cls in LEDGER_ERRORS if cls.code not in errorcodes.BY_CODE}
    assert not missing, missing
    wrong = {cls.__name__ for cls in LEDGER_ERRORS if errorcodes.BY_CODE[cls.code].origin not in ("ledger", "process")}
    assert not wrong, wrong


def test_every_ledger_row_has_a_ledger_error() -> None:
    codes = {cls.code for cls in LEDGER_ERRORS}
    rows = {row.code for row in errorcodes.TABLE if row.origin in ("ledger", "process")}
    assert rows - codes == set(), f"rows without a ledger error: {rows - codes}"


def test_a_ledger_error_with_a_code_that_has_no_row_is_refused() -> None:
    with pytest.raises(KeyError, match="no_such_code"):
        type("Misnamed", (errors.LedgerError,), {"code": "no_such_code"})
    with pytest.raises(ValueError, match="not a ledger error"):
        type("ParsingError", (errors.LedgerError,), {"code": "malformed_json"})


def test_the_client_has_a_class_for_every_row_that_names_one() -> None:
    for row in errorcodes.TABLE:
        if row.client is None:
            assert row.origin in ("ledger", "process"), f"{row.code}: the API answers it, the client needs a class"
            continue
        cls = getattr(client, row.client)
        assert isinstance(cls, type), row.client
        assert cls.code == row.code, row.client
        assert cls.retryable is row.retryable, row.client
        if row.parent is not None:
            assert cls.__bases__ == (getattr(client, errorcodes.BY_CODE[row.parent].client or ""),), row.client
        elif row.code != "ledger_unavailable":
            assert cls.__bases__ == (client.ApiError,), row.client


def test_the_clients_classes_keep_their_names_and_hierarchy() -> None:
    from ledgerdash_client import AttemptBlocked, IdempotencyConflict, InvalidKey, MalformedRequest, NotAllowed

    assert issubclass(IdempotencyConflict, AttemptBlocked)
    assert issubclass(client.InvalidUtf8, MalformedRequest)
    assert issubclass(client.ScopeNotAllowed, NotAllowed)
    assert issubclass(InvalidKey, client.InvalidInput)
    assert client.IdempotencyConflict.__module__ == "ledgerdash_client"
    with pytest.raises(AttributeError):
        _ = client.NoSuchError


def test_the_api_status_of_each_code_is_the_tables() -> None:
    for code, status in {**api_errors.STATUS_BY_CODE, **api_errors.API_CODES}.items():
        assert errorcodes.BY_CODE[code].status == status, code
    every_ledger_or_api_code = {r.code for r in errorcodes.TABLE if r.origin in ("ledger", "api")}
    assert set(api_errors.STATUS_BY_CODE) | set(api_errors.API_CODES) == every_ledger_or_api_code


def test_the_openapi_document_lists_every_code_the_api_answers() -> None:
    doc = Client().get("/api/v1/openapi.json").json()
    assert doc["components"]["schemas"]["ErrorOut"]["properties"]["code"]["enum"] == errorcodes.answered()


def test_each_operation_documents_its_statuses_their_codes_and_headers() -> None:
    doc = Client().get("/api/v1/openapi.json").json()
    documented: set[str] = set()
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if method == "description":
                continue  # the path's own, not an operation
            responses = operation["responses"]
            assert "405" in responses, (method, path)
            if method == "post":
                assert "411" in responses, (method, path)
            for status, answer in responses.items():
                if int(status) < 400:
                    continue
                schema = answer["content"]["application/json"]["schema"]
                codes = schema["allOf"][1]["properties"]["code"]["enum"]
                assert codes == errorcodes.answered(int(status)), (method, path, status)
                documented.update(codes)
            if "401" in responses:
                assert "WWW-Authenticate" in responses["401"]["headers"]
            if "409" in responses:
                assert "Retry-After" in responses["409"]["headers"]
    assert documented == set(errorcodes.answered())
    record = doc["paths"]["/api/v1/attempts"]["post"]["responses"]
    assert "Idempotent-Replayed" in record["200"]["headers"]


@pytest.mark.django_db
def test_every_path_says_what_other_methods_answer_and_they_do(client: Client) -> None:
    """A method a path does not serve answers 405 with Allow, as the path's description in the document says."""
    document = client.get("/api/v1/openapi.json").json()
    for template, item in document["paths"].items():
        served = [method.upper() for method in ("get", "put", "post", "delete", "patch") if method in item]
        assert f"with `Allow: {', '.join(served)}`" in item.get("description", ""), template
        path = template.replace("{attempt_id}", "1")
        for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - set(served):
            response = client.generic(method, path)
            assert response.status_code == 405, (method, path, response.content)
            assert response.json()["code"] == "method_not_allowed"
            assert {m.strip() for m in response["Allow"].split(",")} == set(served), (method, path)
