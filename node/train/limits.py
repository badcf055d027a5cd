"""Named limits of the training loop, shared by code, ``specs/training.md`` and tests."""

from __future__ import annotations

# A signed update header is a handful of short fields; anything larger is garbage or an attack.
MAX_UPDATE_HEADER_BYTES = 4096
# Members whose updates one round aggregates; bounds the memory a round can be made to use.
MAX_ROUND_MEMBERS = 256
# Rounds a replay (verify --replay, late join) recomputes; bounds work an untrusted manifest causes.
MAX_REPLAY_ROUNDS = 1000
# Parameters of a model this loop will build from a run config (the default has ~170 thousand):
# a hard ceiling, checked when the config is read, before anything is allocated, so a run config
# from the network cannot make a node allocate without bound. Below it, what a node accepts is
# what its memory holds (MODEL_MEMORY_* and model.check_model_fits, at `cnode train`'s start).
MAX_MODEL_PARAMETERS_CEILING = 8_000_000_000
# Whole-model float32 buffers a node holds at its peak, per phase (specs/training.md#memory):
# training holds the state, the live model, its gradients, AdamW's two moments, the delta and
# the residual; the aggregation of a round holds the state, the residual, the decoded updates
# (a full round: every member's, whole; "auto" runs full rounds of at most
# PARTITION_MIN_MEMBERS - 1 = 2 members), the aggregate, the new state and CenteredClip's
# temporaries (~0.6 of a model, measured: specs/training.md#memory). The outer momentum,
# if a run has one, adds one to each. A full round whose n decoded updates would pass
# WHOLE_UPDATES_MAX_BYTES reads them one layer at a time instead (_segmented.SegmentedUpdate,
# aggregate(by_layer=True)): n x (one segment + one layer), not n whole updates, so
# ROUND_BUFFERS covers partitioned = "never" too.
TRAINING_BUFFERS = 7
ROUND_BUFFERS = 7
# AdamW's two moments, which a run with inner_optimizer_state = "keep" holds through the round's
# other phases too (in TRAINING_BUFFERS already): added to ROUND_BUFFERS for such runs.
INNER_MOMENT_BUFFERS = 2
# Decoded float32 bytes of a full round's n updates past which the round reads them one layer
# at a time (the same bits; each CenteredClip pass then reads the decoded scratch files again).
WHOLE_UPDATES_MAX_BYTES = 1 << 30
# Bytes a node needs beyond its whole-model buffers (interpreter, torch, libp2p, one layer's
# chunks in flight); measured ~450 MB for a node process at rest.
NODE_BASE_BYTES = 512 * 1024 * 1024
# Local optimizer steps per round; more is a misconfigured run, not a bigger experiment.
MAX_LOCAL_STEPS = 10_000
# Scores (issue 12, _scores.py): sequences per scoring batch (own data and held-out).
SCORE_SEQUENCES = 16
# The relative error of a float32 score loss on any honest device against float64 on the CPU
# (scores/_settle.py). bench/score_precision.py measured at most ~2e-7 (CPU float32, any thread
# count; CUDA float32): 10x margin.
SCORE_DEVICE_RTOL = 2e-6
# What a replay allows between a recorded and a recomputed loss: two devices, each within
# SCORE_DEVICE_RTOL of the reference. Integer scores are compared exactly.
SCORE_LOSS_RTOL = 2 * SCORE_DEVICE_RTOL
# Sequences per forward pass of the fast score losses (scores/_settle.py): batches of a round's
# scoring go through the model together, up to this many sequences at a time (its logits are
# this x seq_len x vocabulary floats).
SCORE_CHUNK_SEQUENCES = 64
# Bytes of a training corpus read from a local file or downloaded from a Hub dataset.
MAX_CORPUS_BYTES = 512 * 1024 * 1024
# A dataset of many Parquet or JSONL files (specs/training.md, "Data"): files it may list; bytes
# of one file (a node downloads it whole, and tokenizes it to disk; memory holds one record batch);
# rows per record batch read from a Parquet file, and bytes per block read from a JSONL file.
MAX_DATASET_FILES = 100_000
MAX_DATASET_FILE_BYTES = 8 * 1024**3
READ_BATCH_ROWS = 1024
READ_BLOCK_BYTES = 4 * 1024 * 1024
# Characters of rows tokenized in one encode_batch call (its Encodings are ~100x their ids).
TOKENIZE_BATCH_CHARS = 256 * 1024
# Characters of text (from the start of the dataset's first file) a tokenizer is trained on,
# when the run trains its own: every node reads the same prefix and trains the same tokenizer.
TOKENIZER_TRAIN_CHARS = 4 * 1024 * 1024

# Seconds a node waits for the coordinator to publish a round's member list after it is ready.
MEMBERS_WAIT_S = 120.0
# Seconds a node waits for the signed headers of a round's members on gossip before it fetches
# the missing ones as blocks, by the CIDs the round record lists.
HEADER_WAIT_S = 5.0
# Tries to fetch one member's update (the first from the member, the rest from every connected
# member), FETCH_RETRY_S x the try number apart.
FETCH_ATTEMPTS = 4
FETCH_RETRY_S = 0.5
# Tries for the update of an outbound-only member this node has no connection to: its blocks
# come from the public member that re-serves them (exchange/_relay.py), which fetches them
# meanwhile; 12 tries span about 33 s, within the round's deadlines.
RELAYED_FETCH_ATTEMPTS = 12
# Seconds a node spends fetching the updates of one round's members before it reports what it
# holds (op `collected`); never past the round's collect deadline less COLLECT_REPORT_MARGIN_S.
ROUND_FETCH_S = 60.0
COLLECT_REPORT_MARGIN_S = 5.0
# Seconds past the round's collect deadline a node waits for the coordinator's decision.
AGREED_WAIT_SLACK_S = 30.0
# Seconds a node spends fetching the updates of the agreed set it still lacks, from every peer
# that may hold them, before it gives the round up and catches up from the agreed state.
AGREED_FETCH_S = 60.0
# Seconds one dial of one peer address may take.
DIAL_TIMEOUT_S = 10.0
# Seconds between two reads of the run state that look for new peers to dial (and bans), per
# DISCOVERY_PEERS_PER_POLL peers the state lists, at most DISCOVERY_POLL_MAX_S: the swarm's
# reads stay about constant in its size (swarm/_peers.discovery_poll_s).
DISCOVERY_POLL_S = 2.0
DISCOVERY_PEERS_PER_POLL = 4
DISCOVERY_POLL_MAX_S = 16.0
# A peer that could not be dialed is tried again after DIAL_BACKOFF_FIRST_S, doubling per
# failure up to DIAL_BACKOFF_MAX_S.
DIAL_BACKOFF_FIRST_S = 1.0
DIAL_BACKOFF_MAX_S = 30.0
# Seconds a node gives the coordinator to take its `leave` (the round goes on without it anyway).
LEAVE_WAIT_S = 5.0
# Seconds a joining node spends fetching the current checkpoint from its holders.
CATCH_UP_FETCH_S = 120.0
# Times a joining node leaves the round it was placed in to wait for a checkpoint it can start
# from (a run with checkpoint_every > 1 has none for most rounds), then joins again.
CATCH_UP_ATTEMPTS = 3
# Seconds it waits for that next checkpoint (checkpoint_every rounds, at most).
CHECKPOINT_WAIT_S = 900.0
# Seconds a node waits for the coordinator to record the checkpoint it compares its own with.
AGREE_WAIT_S = 30.0
# Seconds a node started with --join-after-round waits for that round (late-join testing).
JOIN_WAIT_S = 3600.0
# Seconds between two polls of the coordinator while waiting (a poll is one small HTTP request),
# and while waiting long (for a round to be published before a late join, for a checkpoint).
POLL_INTERVAL_S = 0.2
SLOW_POLL_S = 1.0
# Shortest hold of a node's long poll for partition results while it waits for its backup turn
# (the poll answers at once when the last result comes; this only bounds re-polls near a turn).
BACKUP_POLL_MIN_S = 1.0
# Seconds between two looks at the headers gossip brought in, while waiting for stragglers.
HEADER_CHECK_S = 1.0
# Seconds a node spends sending one dashboard report (held-out loss, catch-up) to the
# coordinator; past it the report is dropped: the dashboard is not worth delaying a round.
REPORT_WAIT_S = 5.0

# Partitioned rounds (_partitioned.py, _partition_exchange.py; specs/training.md).
# Most members a partition result lists (inputs, rejections, records): the round's member cap.
MAX_PARTITION_MEMBERS = MAX_ROUND_MEMBERS
MAX_PEER_ID_CHARS = 128  # a peer id in a partition result
MAX_REASON_CHARS = 512  # one rejection or missing reason in a partition result
# A signed partition result: ~200 bytes per member at most, for MAX_PARTITION_MEMBERS.
MAX_PARTITION_RESULT_BYTES = 96 * 1024
# Default of training.verify_partitions: partitions each member recomputes per round, chosen
# after every result is out. Each costs about one update of traffic (its inputs' slices).
VERIFY_PARTITIONS = 1
MAX_VERIFY_PARTITIONS = 64
# How long a node waits for the round's results to be recorded (the result window opens at the
# collect deadline or the scores' close, up to SCORE_CLOSE_MAX_S late; then the aggregator and
# three backups have a step each, at most BACKUP_STEP_MAX_S = 60 s), and for the agreed record
# after its check.
RESULTS_WAIT_S = 420.0
# Evidence of a wrong partition result (a CAR, specs/training.md#verification): the partition's
# segments of every input plus manifests; the coordinator refuses more (its own limit is equal).
MAX_EVIDENCE_BYTES = 256 * 1024 * 1024
MAX_EVIDENCE_BLOCKS = 1_000_000

# Scores in partitioned rounds (_score_records.py, _score_spread.py; specs/training.md).
# Scorers of each update: each member scores the updates of the next SCORERS_PER_UPDATE members
# in the round's assignment order (fewer when the round has fewer other members). Two, so one
# lying scorer is always contradicted by the other (a dispute), unless both lie.
SCORERS_PER_UPDATE = 2
# Targets one score record may name (scored and unscored together): the scorer's assignment.
MAX_SCORE_TARGETS = SCORERS_PER_UPDATE
# A signed score record: two targets of ~130 bytes, two reasons of MAX_REASON_CHARS at most.
MAX_SCORE_RECORD_BYTES = 4096
# Seconds an aggregator waits, past its inputs' fetch, for the coordinator to close the round's
# score records (every member reported, or the score deadline passed) before it gives its
# partition up (a backup takes it over).
SCORES_WAIT_S = 60.0
# Held-out sequences the loss report evaluates in one forward pass: the loss is the same mean
# over every predicted token as one pass over all ``eval_sequences`` gives (up to float
# rounding), and the pass's memory is that of this many sequences whatever the run config sets
# (issue 41: 32 members on one machine, each evaluating 64 sequences at once at the end of a
# round, met the OOM killer; one pass over 64 sequences of 64 tokens of the 1.4M model took
# 94 MB, eight at a time 32 MB).
EVAL_BATCH_SEQUENCES = 8
