"""The exception handlers the app installs: whatever goes wrong, the body is an OpenAI error."""

from __future__ import annotations

import pytest
from litestar import Litestar, get
from litestar.exceptions import HTTPException
from litestar.testing import TestClient

from edge.errors import ApiError, handle_api_error, handle_http_exception, handle_unexpected, wait_text


@get("/boom")
async def boom() -> None:
    raise RuntimeError("secret internal detail /etc/passwd")


@get("/limited")
async def limited() -> None:
    raise ApiError(429, "slow down", type="rate_limit_exceeded", code="tokens", headers={"retry-after": "3"})


APP = Litestar(
    [boom, limited],
    exception_handlers={
        ApiError: handle_api_error,
        HTTPException: handle_http_exception,
        Exception: handle_unexpected,
    },
)


def test_unexpected_error_is_a_500_without_internals() -> None:
    with TestClient(APP) as client:
        response = client.get("/boom")
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "api_error"
    assert "secret" not in response.text and "Traceback" not in response.text


def test_api_error_keeps_status_code_and_headers() -> None:
    with TestClient(APP) as client:
        response = client.get("/limited")
    assert response.status_code == 429
    assert response.headers["retry-after"] == "3"
    assert response.json() == {
        "error": {"message": "slow down", "type": "rate_limit_exceeded", "param": None, "code": "tokens"}
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0004, "1ms"),
        (0.85, "850ms"),
        (3.891, "3.9s"),
        (3.89, "3.89s"),
        (1.2345, "1.24s"),
        (12.31, "12.4s"),
        (59.4, "59.4s"),
        (360, "6m0s"),
        (3600, "1h0m"),
        (7500, "2h5m"),
        # Never shorter than the wait (the 429 of a day's budget spent: retry-after 5184 s).
        (7501, "2h6m"),
        (5183.904, "1h27m"),
        (3659.2, "1h1m"),
    ],
)
def test_a_wait_reads_as_a_person_reads_it(seconds: float, text: str) -> None:
    assert wait_text(seconds) == text
