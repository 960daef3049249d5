"""OpenAI-shaped errors (``{"error": {message, type, param, code}}``) and the HTTP status of each gRPC code."""

from __future__ import annotations

from fastapi.responses import JSONResponse

STATUS = {"INVALID_ARGUMENT": 400, "OUT_OF_RANGE": 400, "FAILED_PRECONDITION": 400, "ALREADY_EXISTS": 409,
          "NOT_FOUND": 404, "RESOURCE_EXHAUSTED": 429, "UNAUTHENTICATED": 401, "UNAVAILABLE": 503,
          "DEADLINE_EXCEEDED": 504}  # fmt: skip


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers | (headers or {}))


def error_for(exc: BaseException) -> ApiError:
    """The ApiError of an exception from the servicer: its ``grpc_code``'s status, else a 500."""
    if isinstance(exc, ApiError):
        return exc
    code = getattr(exc, "grpc_code", None)
    if code is None:
        return ApiError(500, f"{type(exc).__name__}: {exc}", "server_error")
    headers = {}
    if code == "RESOURCE_EXHAUSTED" and getattr(exc, "retry_after_ms", None):
        headers["Retry-After"] = str(max(1, round(exc.retry_after_ms / 1000)))
    kind = "invalid_request_error" if STATUS.get(code, 500) < 500 else "server_error"
    return ApiError(STATUS.get(code, 500), str(exc), kind, code=code.lower(), headers=headers)
