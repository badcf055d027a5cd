"""Named limits of the coordinator, shared by code, ``specs/coordinator.md`` and tests.

Every size read from the network is bounded here; every rate is per peer id (the signer of the
request envelope), because on a real network one IP may hide many peers and one peer many IPs.
"""

from __future__ import annotations

# Bytes of one HTTP request body (a JSON object holding one base64 envelope). A join with an HF
# binding and token is about 1 KiB; 64 KiB leaves room and still bounds what a peer makes us read.
MAX_REQUEST_BYTES = 64 * 1024
# Bytes of a decoded request envelope (the base64 inside the JSON decodes to at most this).
MAX_ENVELOPE_BYTES = 48 * 1024
# Bounds on every number that enters over HTTP (paths, query strings, signed request fields),
# checked where it enters, before any query: all stay far below SQLite's INTEGER range (2**63), so
# no input can overflow a query. Past one: 400 bad_request naming the field and the bound.
# Rounds and epochs: at one round a second, 2**31 - 1 lasts 68 years.
MAX_ROUND = 2**31 - 1
MAX_EPOCH = MAX_ROUND
# Request counters: the client sends microseconds since the epoch (about 2**51 in 2026); 2**53
# (the largest integer a JSON double holds exactly) lasts until the year 2255.
MAX_COUNTER = 2**53
# Change-log sequence numbers an admin pages from (`log` after=).
MAX_LOG_SEQ = 2**53
# Numbers of a node's report (loss, seconds, bytes): finite, >= 0, at most this.
MAX_REPORT_NUMBER = 2.0**53
# Digits of an integer in a path or query string (a sign aside): 2**53 has 16.
MAX_INT_DIGITS = 20
# Deepest nesting of JSON the coordinator reads (request bodies, ban-evidence figures) and its
# client reads (answers): real ones nest 3 levels; Python's parser recurses, so 100,000 `[`
# would raise RecursionError. One bound, one check (``_json.loads_bounded``) on both sides.
MAX_JSON_DEPTH = 32
# Characters of a free-text field a peer or admin sends (ban reason, HF repo, revision).
MAX_TEXT_CHARS = 512
# Characters of ban-evidence figures, serialized as JSON text.
MAX_FIGURES_CHARS = 4096
# Characters of an HF token forwarded to whoami; real ones are ~40.
MAX_HF_TOKEN_CHARS = 256
# Characters of a CID string (a CIDv1 sha2-256 in base32 is 59).
MAX_CID_CHARS = 128

# Joins per peer: a bucket of this many, refilled at JOIN_RATE_PER_S. A join may call the HF Hub,
# so it is the expensive request and the first a flood would use.
JOIN_BURST = 3
JOIN_RATE_PER_S = 0.2
# All other signed requests per peer: burst and sustained rate.
REQUEST_BURST = 30
REQUEST_RATE_PER_S = 10.0
# Peers whose rate buckets are kept in memory; the oldest are forgotten past this.
MAX_RATE_BUCKETS = 100_000

# Longest a GET .../rounds/{n}?wait=S holds the connection; clients loop for longer waits.
MAX_LONG_POLL_S = 10.0
# Distinct rounds long polls may wait on at once (per kind of wait); a poll of another round, or
# of a round past the next one, just sleeps its wait (no event kept), then answers.
MAX_POLLED_ROUNDS = 1024
# Published rounds whose signed answers are kept in memory (the newest; older ones are re-signed).
ROUND_CACHE = 64
# Members of one round; joins beyond are refused with 409 round_full.
MAX_ROUND_MEMBERS = 10_000
# Entries of the allowlist (users + peers + orgs).
MAX_ALLOWLIST = 100_000
# Change-log entries returned by one admin.log request.
MAX_LOG_PAGE = 1000
# Checkpoint records one signed history page holds (GET .../checkpoints).
MAX_CHECKPOINT_PAGE = 256

# Seconds between two gossipsub publications of the run state (changes in between coalesce): stays
# under py-libp2p's per-topic spam limit (10 msg/s) with room for everyone else.
GOSSIP_MIN_INTERVAL_S = 0.5
# Seconds after which the current state is published again, for subscribers that came late.
GOSSIP_REPUBLISH_S = 30.0
# Seconds between two checks of round and phase deadlines in the server.
TICK_S = 0.1
# Seconds a join waits for the HF Hub whoami answer before it fails with 502.
HF_WHOAMI_TIMEOUT_S = 15.0
# Bounds on run-config values; a run outside them is a mistake, not an experiment.
MIN_TOKEN_TTL_S = 30
MAX_TOKEN_TTL_S = 7 * 24 * 3600
MAX_ROUND_TIMEOUT_S = 24 * 3600

# Addresses one peer may advertise in its join, and characters of each (a multiaddr with a peer
# id is about 90). Round records carry them for every listed peer, so they are kept small.
MAX_PEER_ADDRS = 8
MAX_ADDR_CHARS = 256
# Seconds the coordinator waits for a joiner's advertised addresses to accept a TCP connection
# (all dialed at once, specs/coordinator.md#reachability): a join takes this much longer at most,
# for an address that drops packets; a refused or unrouted one answers at once.
DIAL_BACK_TIMEOUT_S = 3.0
# Peer ids a member may name in one `collected` report (the members whose update it lacks).
MAX_MISSING_REPORT = MAX_ROUND_MEMBERS

# Seconds the async client keeps retrying a request the coordinator does not answer (refused
# connections, resets, 5xx) before it gives up: a coordinator restart on the same database takes
# a few seconds, and a node must live through it. Retries back off from CLIENT_RETRY_FIRST_S,
# doubling up to CLIENT_RETRY_MAX_S. A 4xx refusal is never retried (it changed nothing).
COORDINATOR_OUTAGE_S = 60.0
CLIENT_RETRY_FIRST_S = 0.25
CLIENT_RETRY_MAX_S = 4.0

# The dashboard (specs/coordinator.md#dashboard). Its JSON is rebuilt only after a change and
# every list in it is capped, so a page polled by many viewers costs little and stays small.
# Seconds between two polls of the page (sent in the JSON: the script takes it from there).
DASHBOARD_POLL_S = 2.0
# Newest rounds listed with their members, and members listed per round (the count is exact).
DASHBOARD_ROUNDS = 30
DASHBOARD_MEMBERS = 64
# Rounds of held-out loss in the chart (the newest).
DASHBOARD_LOSS_ROUNDS = 500
# Partitions listed per partitioned round, with their aggregator and result (`parts` is exact).
DASHBOARD_PARTITIONS = 64
# Newest bans listed, and evidence reports shown per ban.
DASHBOARD_BANS = 100
DASHBOARD_EVIDENCE = 32
# Newest checkpoints listed, and holders named per checkpoint.
DASHBOARD_CHECKPOINTS = 50
DASHBOARD_HOLDERS = 64
# Newest catch-up reports listed.
DASHBOARD_CATCH_UPS = 50
# Peers (peer id <-> HF username) and allowlist entries listed.
DASHBOARD_PEERS = 500
# Holders named in one catch-up report (bytes per holder); more is refused with 400.
MAX_REPORT_HOLDERS = 64

# Most trustless gateways a run config may list (specs/gateway.md, specs/training.md).
MAX_RUN_GATEWAYS = 16

# Partitioned rounds (specs/coordinator.md#partitioned-rounds). Backups of a partition whose
# aggregator published no result take over one after another, every rounds.backup_step_s after
# the collect deadline; after this many steps the round is agreed without the partitions still
# missing (they keep the parent state on every node).
MAX_PARTITION_BACKUPS = 3
# Scores in partitioned rounds (op `score`): records are taken until SCORE_CLOSE_MARGIN_S before
# the collect deadline (when aggregators stop fetching and aggregate), or until every member has
# reported one; then the round's score records are closed and every node reads the same set.
SCORE_CLOSE_MARGIN_S = 5.0
# Deadlines that follow the swarm (_pace.py, specs/coordinator.md#pace): past a phase's nominal
# deadline, members still missing keep it open (a loaded member is late, not wrong): once a
# strict majority reported, until PACE_FACTOR x the median member's time for the phase after its
# start; without a majority, until there is one; never more than its late bound past
# the nominal deadline: the run's rounds.late_max_s (default 60 s) for `collected` reports of a
# full round and `checked` reports of a partitioned one; for score records, at most
# SCORE_CLOSE_MAX_S (the node's SCORES_WAIT_S is longer).
PACE_FACTOR = 2.0
SCORE_CLOSE_MAX_S = 40.0
# Partition results: the result window opens at the collect deadline, or when the score records
# close if later (aggregators wait for them). The aggregator has the first step of it; backup k
# (from 0) may submit from window + (k + 1) steps; partitions still without a result after
# MAX_PARTITION_BACKUPS + 1 steps keep the parent state. A step is rounds.backup_step_s, or the
# median member's time to score (publish -> score record) when that is longer, at most
# BACKUP_STEP_MAX_S: a swarm that needed 20 s to fetch and score two updates needs about that to
# fetch and aggregate one partition.
BACKUP_STEP_MAX_S = 60.0
# A signed score record sent with op `score` (its bytes are kept and served to every member, so
# one that its scorer will not serve over libp2p is still the same for everyone); the node's
# own bound is equal (node/train/limits.py).
MAX_SCORE_RECORD_BYTES = 4096
# Bytes of the CAR file of evidence blocks a member sends against a wrong partition result (the
# partition's inputs, the header and what it names). Read streaming with this bound, outside the
# app's client_max_size; beyond it: 413.
MAX_EVIDENCE_BYTES = 256 * 1024 * 1024
# Evidence checks (body read + recomputation in a worker thread, or a reputation replay) in
# progress at once; more wait EVIDENCE_QUEUE_WAIT_S for one, then get 429 busy with Retry-After.
# Bounds memory at this many MAX_EVIDENCE_BYTES bodies.
MAX_EVIDENCE_CHECKS = 2
# Evidence checks one member may hold at once (its share): one more is refused at once with 429
# evidence_share, so no member can hold every check and starve the others' evidence.
MAX_EVIDENCE_CHECKS_PER_PEER = 1
# Seconds a request waits for a free evidence check before 429 busy (Retry-After
# EVIDENCE_RETRY_AFTER_S).
EVIDENCE_QUEUE_WAIT_S = 1.0
EVIDENCE_RETRY_AFTER_S = 5.0
# An evidence body must arrive within EVIDENCE_BODY_DEADLINE_S, and every EVIDENCE_RATE_WINDOW_S
# window of it must bring at least EVIDENCE_MIN_RATE_BPS x the window in bytes; else 408
# too_slow and the check is freed. 256 KiB/s is far below any link a member trains over;
# MAX_EVIDENCE_BYTES at that rate would take 17 min, so the deadline, not the rate, bounds a
# whole upload (300 s: 256 MiB needs ~0.9 MB/s).
EVIDENCE_MIN_RATE_BPS = 256 * 1024
EVIDENCE_RATE_WINDOW_S = 10.0
EVIDENCE_BODY_DEADLINE_S = 300.0
# Seconds a client waits for the answer to its evidence (upload and the coordinator's
# recomputation of one partition).
EVIDENCE_READ_TIMEOUT_S = 600.0
# Bytes of one HTTP header field the server reads: the evidence request's signed envelope travels
# base64 in X-Cnode-Request, so this must hold a MAX_ENVELOPE_BYTES envelope in base64.
MAX_HEADER_FIELD_BYTES = 4 * ((MAX_ENVELOPE_BYTES + 2) // 3) + 1024

# Bans: outlier reports about one peer add up over this many rounds (each node's BanPolicy
# reaches "k of the last m rounds" at the round its own history allows: BAN_M = 5).
BAN_REPORT_WINDOW = 5
# Rounds, and signed score records in them, the coordinator replays to check a reputation-ban
# report itself (round 1 to the report's round, in a worker thread; ~0.4 ms per record on one
# core: 16,384 records take some 7 s). A report beyond either is left to the majority rule.
MAX_REPUTATION_REPLAY_ROUNDS = 256
MAX_REPUTATION_REPLAY_RECORDS = 16_384
