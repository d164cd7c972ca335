from typing import Literal

ClaimFinishedOutcome = Literal["completed", "failed"]

CLAIM_FINISHED_OUTCOME_VALUES: set[ClaimFinishedOutcome] = {
    "completed",
    "failed",
}


def check_claim_finished_outcome(value: str) -> ClaimFinishedOutcome:
    if value in CLAIM_FINISHED_OUTCOME_VALUES:
        return value
    raise TypeError(f"Unexpected value {value!r}. Expected one of {CLAIM_FINISHED_OUTCOME_VALUES!r}")
