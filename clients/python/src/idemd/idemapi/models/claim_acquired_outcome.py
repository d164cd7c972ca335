from typing import Literal

ClaimAcquiredOutcome = Literal["acquired"]

CLAIM_ACQUIRED_OUTCOME_VALUES: set[ClaimAcquiredOutcome] = {
    "acquired",
}


def check_claim_acquired_outcome(value: str) -> ClaimAcquiredOutcome:
    if value in CLAIM_ACQUIRED_OUTCOME_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {CLAIM_ACQUIRED_OUTCOME_VALUES!r}")
