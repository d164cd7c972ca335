from typing import Literal

PutResultIdemdSealed = Literal["1"]

PUT_RESULT_IDEMD_SEALED_VALUES: set[PutResultIdemdSealed] = {
    "1",
}


def check_put_result_idemd_sealed(value: str) -> PutResultIdemdSealed:
    if value in PUT_RESULT_IDEMD_SEALED_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {PUT_RESULT_IDEMD_SEALED_VALUES!r}")
