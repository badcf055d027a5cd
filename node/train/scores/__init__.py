"""Scores of updates on data anyone can check: computing the losses, the signed score records,
who scores whom in a partitioned round, and the coordinator's replay of reputation evidence.

The names other parts of ``cnode.node.train`` use; the modules stay private.
"""

from __future__ import annotations

from ._records import SCORE_RECORD_TYPE as SCORE_RECORD_TYPE
from ._records import BadScoreRecordError as BadScoreRecordError
from ._records import ScoreRecord as ScoreRecord
from ._records import TargetLosses as TargetLosses
from ._records import open_score_record as open_score_record
from ._records import score_record_cid as score_record_cid
from ._records import seal_score_record as seal_score_record
from ._reputation_evidence import check_reputation_evidence as check_reputation_evidence
from ._scoring import RoundScoring as RoundScoring
from ._scoring import check_recorded_scores as check_recorded_scores
from ._scoring import checkpoint_reputation as checkpoint_reputation
from ._settle import BOUNDARY_UNITS as BOUNDARY_UNITS
from ._settle import LossModels as LossModels
from ._settle import near_boundary as near_boundary
from ._settle import settle_needed as settle_needed
from ._spread import BAD_RECORD_REASON as BAD_RECORD_REASON
from ._spread import INVALID_PREFIX as INVALID_PREFIX
from ._spread import SpreadRecords as SpreadRecords
from ._spread import SpreadScores as SpreadScores
from ._spread import disputed_targets as disputed_targets
from ._spread import resolve_scores as resolve_scores
from ._spread import targets_of as targets_of
