"""Named limits and defaults of cnode.aggregation, shared by code, specs/aggregation.md and tests.

Changing any value marked *part of the result* changes aggregate bytes: every honest node of a run
must use the same value, so treat such a change as a protocol change.
"""

# Chunk width W: each layer is cut into chunks of W elements; sums of squares are accumulated
# per position across chunks and reduced with a fixed tree. Part of the result, and a function
# of the number n of accepted updates only: W = the largest power of two <= WORK_ELEMENTS / n,
# clamped to [MIN_CHUNK_ELEMENTS, CHUNK_ELEMENTS]. Every node aggregating the same set has the same
# n, hence the same W, while one working block (n x W float64) stays at 8 MiB for any n.
CHUNK_ELEMENTS = 1 << 16  # W for n <= 16
MIN_CHUNK_ELEMENTS = 1 << 10  # W for n >= 1024
WORK_ELEMENTS = 1 << 20

# Tile: how many columns of a chunk are processed at once. NOT part of the result (every
# operation is element-wise along columns, and column j of a tile adds into its own accumulator
# column), only of the speed: one n x tile float64 block of TILE_WORK_ELEMENTS (1 MiB) stays
# in a core's L2 cache. tile = the largest power of two <= TILE_WORK_ELEMENTS / n, clamped to
# [MIN_TILE_ELEMENTS, TILE_ELEMENTS] and to W. (Measured: CenteredClip of 4 x 2.5M values,
# 0.066 s at 2^13 / 2^16, 0.051-0.056 s at 2^15 / 2^17, same bits: fewer, longer kernels; the
# per-call overhead of ~10 torch calls per tile dominated small tiles.)
TILE_ELEMENTS = 1 << 15
MIN_TILE_ELEMENTS = 1 << 10
TILE_WORK_ELEMENTS = 1 << 17

# Update codec int8-blockwise (_codec.py, specs/training.md#update-codecs): values per block, each
# block with one float32 scale. Part of the wire format: every peer of a run must use the same
# value. 4096 keeps the scales at 0.1% of the bytes (ratio to f32: 0.2510).
CODEC_BLOCK = 4096

# Sparse update codecs (_sparse.py, specs/aggregation.md#sparse-codecs). Part of the wire format.
# Values per chunk: each chunk keeps its own top K and addresses them with 12-bit offsets.
SPARSE_CHUNK = 4096
# K per chunk of a run's updates (training.update_density x SPARSE_CHUNK) when nothing else is
# said: 1/64, SparseLoCo's density, measured on bench/codec_loss.py (specs/training.md).
SPARSE_DEFAULT_K = 64
# A partition's aggregate in a sparse run keeps RESULT_FACTOR x K values per chunk: the largest
# of the union of its inputs' supports, so what every member fetches stays flat in n.
SPARSE_RESULT_FACTOR = 2

# Partitioned aggregation (_partition.py, specs/aggregation.md "Partitioned aggregation"): the
# flat update is cut into SEGMENTS segments of equal size (within one value), the unit a
# partition is made of and the layer an update is stored as. A fixed count, not a fixed size, so
# that a round's partition count min(members, SEGMENTS) follows from its member list alone (the
# coordinator assigns partitions without knowing the model). Part of the result and of the update
# layout. 64: partitions of 16 members differ by no segment, of 3 members by one in 21.
SEGMENTS = 64

# Most updates one aggregate() call accepts (the run's member list is bounded far below this).
# Working memory is about 6 blocks of max(n x W, ...) float64: 48 MiB up to n = 1024.
MAX_UPDATES = 4096

# Longest peer id string accepted as a key (base58 libp2p ids are ~52 characters).
MAX_PEER_ID_LENGTH = 128

# Most reasons listed when an update has several wrong names (keeps evidence messages short).
MAX_NAMES_IN_REASON = 5

# CenteredClip defaults. Part of the result.
CLIP_MAX_ITERATIONS = 30  # iteration cap; converged runs stop much earlier
CLIP_TOLERANCE = 1e-4  # stop when the step length is below CLIP_TOLERANCE * tau
# Scale-free tau: tau = CLIP_TAU_SCALE * median distance of the updates to the robust start,
# recomputed each round. See specs/aggregation.md "Choosing tau" for the reasoning.
CLIP_TAU_SCALE = 1.0
# A peer farther from the current centre than CLIP_REJECT_SCORE x the median distance gets clip
# weight 0 (0 turns this off). Part of the result. The same unit as OUTLIER_SCORE (a multiple of
# a median distance), not the same value: 1.5 was chosen on bench/robustness.py (specs/
# aggregation.md), OUTLIER_SCORE = 3.0 marks ban evidence. A peer scoring between the two is left
# out of that round's aggregate but does not count towards a ban.
CLIP_REJECT_SCORE = 1.5

# Ban evidence: a peer is an outlier in a round when its distance to the aggregate exceeds
# OUTLIER_SCORE times the median distance of the accepted peers. Honest non-iid peers measured at
# < 2.0 (tests/aggregation/test_ban.py); noise/sign-flip attackers at > 5.
OUTLIER_SCORE = 3.0
# BanPolicy default: recommend after BAN_K outlier rounds within the last BAN_M observed rounds.
BAN_K = 3
BAN_M = 5

# Attack harness defaults (cnode.aggregation.ATTACKS).
GAUSSIAN_STD_FACTOR = 100.0  # noise std = factor x RMS of the attacker's honest update
IPM_EPSILON = 0.1  # inner-product manipulation: send -epsilon x mean of honest updates
IPM_LARGE_EPSILON = 10.0  # the variant aimed at the plain mean
STALE_DELAY_ROUNDS = 5  # the stale attacker replays its own update from this many rounds ago
ALIE_MAX_Z = 3.0  # cap on z when f is so large that the formula's quantile reaches 1
SPIKE_FRACTION = 1 / 4096  # sparse_spike: share of coordinates holding the whole budget

# Scores and reputation (_scores.py, specs/aggregation.md "Scores and reputation"). Part of the
# result: every node of a run must use the same values, or admission, hence the aggregate, differs.
# Losses are taken at theta + SCORE_STEP x update: a power of two (the scaling is exact). At full
# step honest SGD updates that overshoot score negative late in training; at 1/8 a data attack's
# harm on the text model is second order and hides in the noise; 1/4 separates both (measured,
# specs/aggregation.md "Scores and reputation").
SCORE_STEP = 0.25
SCORE_UNIT = 1e-4  # a score is an integer number of these (relative loss decrease), |score| <= 1
# The range of a loss that scores: a measured loss (cross-entropy, >= 0) is at most
# MAX_SCORE_LOSS (a larger or infinite one after the update means the update blew the model up;
# before it, the state has no usable loss on the batch), and counts as at least SCORE_LOSS_FLOOR:
# a batch the state fits to within 1e-3 nats cannot measure a relative change, so differences
# below the floor score 0 and no denominator is 0 or denormal. With both bounds every relative
# change is within +-MAX_SCORE_LOSS / SCORE_LOSS_FLOOR = 1e9: loss_score is total.
MAX_SCORE_LOSS = 1e6
SCORE_LOSS_FLOOR = 1e-3
MAX_SCORE_BATCH = 1024  # most samples in one scoring batch (draw_indices)
REPUTATION_DIVISOR = (
    4  # integer EMA: r <- r + floor((d - r) / 4), i.e. weight 1/4 on the new figure
)
# Revision 4 (issue 24): every decision is taken on a peer's *standing*, its scores measured in
# honest spreads. Per round and per component (own, held): med = the lower median of the scored
# peers' scores, spread = max(SPREAD_FLOOR, the (n - fmax)-th smallest absolute deviation from
# med), fmax = (n - 1) // 2. With f <= fmax attackers both lie within what the honest scores
# give (specs/aggregation.md "Scores and reputation"). A component's standing is
# floor(100 x (score - med) / spread) clamped to +-STANDING_CLAMP (hundredths of a spread); the
# round standing (reputation, bans) is the own one clamped; the held one is for admission only.
SPREAD_FLOOR = 10  # units (0.1 %): a round whose scores agree this closely has no usable spread
STANDING_CLAMP = 300  # one round moves a reputation by at most 3 spreads / REPUTATION_DIVISOR
# Admission: both components' standings >= -ADMIT_SPREADS x 100 (an update at most 3 honest
# spreads below the median on its own data and, on its own, on the shared held-out data: own-data
# gain cannot pay for held-out harm), and the reputation after the round >= ADMIT_REPUTATION.
ADMIT_SPREADS = 3
ADMIT_REPUTATION = -250  # the reputation gate keeps out only a peer at the ban bound
# Revision 5 (issue 24): the own-data floor. An update trained on its sender's data makes that
# data's loss lower; one that raises it by more than a share of what the median member's update
# gains was not trained on it. floor = min(med, 0) - OWN_FLOOR_PERCENT % x |med| (med: the own
# component's lower median). Below the floor an update is not admitted, whatever the spread (the
# spread of honest scores on skewed shards spans thousands of units: 3 spreads under the lowest
# honest score admitted sign-flipped updates), and only such a round counts towards a ban: an
# honest update whose own data it improved is never banned, however far below the others.
OWN_FLOOR_PERCENT = 10
# Bans: reputation (the EMA of round standings) below BAN_REPUTATION in REPUTATION_BAN_ROUNDS
# scored rounds in a row, each with the own score below the floor. Measured on honest peers
# (200-round bench runs): see the false-ban rate in specs/aggregation.md.
BAN_REPUTATION = -250
REPUTATION_BAN_ROUNDS = 3  # ... in this many scored rounds in a row -> ban recommendation
# ... or, without waiting for the average: a round standing at least BLATANT_SPREADS honest
# spreads below the median (own data, unclamped) and under the own floor in
# REPUTATION_BAN_ROUNDS scored rounds in a row (honest standings measured on the bench: 1st
# percentile -6 to -9.5 spreads).
BLATANT_SPREADS = 10
# Issue 36: a peer whose scored update the admission leaves out in this many scored rounds in a
# row is recommended for a ban (kind left_out): its updates only cost the swarm (scoring, the
# exchange) and a stall attacker lives on exactly that. Measured on bench/robustness.py: see the
# false-ban rate in specs/aggregation.md "The round decision".
LEFT_OUT_BAN_ROUNDS = 10
# CenteredClip on the admitted updates (scored_config()): distance rejection off, tau = 3 x the
# median distance, so honest heterogeneous updates are almost never clipped while a far update
# that passed the scores still pulls by at most tau.
SCORED_TAU_SCALE = 3.0
