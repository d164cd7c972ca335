"""Contains all the data models used in inputs/outputs"""

from .abandoned_key import AbandonedKey
from .abandoned_keys import AbandonedKeys
from .batch_item import BatchItem
from .batch_item_result import BatchItemResult
from .batch_request import BatchRequest
from .batch_results import BatchResults
from .claim_acquired import ClaimAcquired
from .claim_acquired_outcome import ClaimAcquiredOutcome
from .claim_finished import ClaimFinished
from .claim_finished_outcome import ClaimFinishedOutcome
from .claim_request import ClaimRequest
from .complete_request import CompleteRequest
from .extend_request import ExtendRequest
from .health import Health
from .import_summary import ImportSummary
from .kept_record import KeptRecord
from .key_record import KeyRecord
from .lease_extended import LeaseExtended
from .problem import Problem
from .put_result_idemd_sealed import PutResultIdemdSealed
from .quota_usage import QuotaUsage
from .recovery_point import RecoveryPoint
from .recovery_point_request import RecoveryPointRequest
from .release_request import ReleaseRequest
from .release_request_mode import ReleaseRequestMode
from .stored_response import StoredResponse
from .stored_response_headers import StoredResponseHeaders

__all__ = (
    "AbandonedKey",
    "AbandonedKeys",
    "BatchItem",
    "BatchItemResult",
    "BatchRequest",
    "BatchResults",
    "ClaimAcquired",
    "ClaimAcquiredOutcome",
    "ClaimFinished",
    "ClaimFinishedOutcome",
    "ClaimRequest",
    "CompleteRequest",
    "ExtendRequest",
    "Health",
    "ImportSummary",
    "KeptRecord",
    "KeyRecord",
    "LeaseExtended",
    "Problem",
    "PutResultIdemdSealed",
    "QuotaUsage",
    "RecoveryPoint",
    "RecoveryPointRequest",
    "ReleaseRequest",
    "ReleaseRequestMode",
    "StoredResponse",
    "StoredResponseHeaders",
)
