from typing import Literal

ReleaseRequestMode = Literal["fail", "retry"]

RELEASE_REQUEST_MODE_VALUES: set[ReleaseRequestMode] = {
    "fail",
    "retry",
}


def check_release_request_mode(value: str) -> ReleaseRequestMode:
    if value in RELEASE_REQUEST_MODE_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {RELEASE_REQUEST_MODE_VALUES!r}")
