"""Named limits of cnode.node.p2p, shared by code, specs/blocks.md, specs/announce.md and tests.

Every size or count read from a peer is checked against one of these before it is used.
"""

from __future__ import annotations

from cnode.auth.limits import MAX_TOKEN_SIZE
from cnode.storage.limits import MAX_BLOCK_SIZE

# -- /cnode/blocks/1.0.0 (specs/blocks.md#limits) ------------------------------------------------

# Most CIDs one request may name. 64 x 1 MiB keeps one response under ~64 MiB of wire time.
MAX_REQUEST_CIDS = 64
# Longest binary CID accepted on the wire (CIDv1 sha2-256 is 36 bytes; slack for varints).
MAX_CID_BYTES = 64
# Largest REQUEST frame body: a count byte plus, per CID, a length byte and the CID.
MAX_REQUEST_FRAME = 2 + MAX_REQUEST_CIDS * (1 + MAX_CID_BYTES)
# Largest frame body of any kind: a BLOCK frame is a CID plus one block.
MAX_FRAME_BODY = 1 + MAX_CID_BYTES + MAX_BLOCK_SIZE
# Longest human-readable text in an ERROR frame.
MAX_ERROR_TEXT = 512
# Requests one fetcher keeps in flight per holder (each on its own stream). 2 hides the gap
# between requests; more streams only contend in yamux (measured: 1: 55, 2: 60, 3: 45 MB/s).
MAX_IN_FLIGHT_PER_HOLDER = 2
# Blocks of one request received whole and waiting to be hashed and stored while the next one
# arrives (specs/blocks.md#fetching, 12): memory per request is about this many MAX_BLOCK_SIZE.
RECEIVED_AHEAD = 2
# Blocks a holder reads (and verifies) from its store ahead of the one it is sending.
SERVE_READ_AHEAD = 1
# Blocks up to this size are hashed, stored and read on the event loop's own thread, larger ones
# in a worker thread (specs/blocks.md#threads). A thread hop costs ~100-150 us of CPU per block
# whatever its size (trio's start_thread_soon was 3.9% of a 16-member node's CPU, most blocks a
# sparse round moves being a few hundred bytes to a few KB); hashing 64 KiB takes ~70 us and a
# read or batched write of one ~60-200 us (bench/block_hops.py): below this the inline work
# costs less than the hop would, and the loop never stalls longer than a hop's own cost.
INLINE_BLOCK_BYTES = 64 * 1024
# Requests one holder serves at once for one peer; more are refused with BUSY.
MAX_SERVED_STREAMS_PER_PEER = 8
# Seconds a new stream's protocol selection may take, both ways (py-libp2p's ConnectionConfig:
# 10 s). A holder busy on a loaded machine answered later than that at 8 and 16 members (384
# "failed to open a stream" drops at 16): selection is one round trip through both event loops.
STREAM_NEGOTIATION_TIMEOUT_S = 30.0
# Seconds a request may spend opening its stream to the holder (protocol selection and, once
# per connection, showing our token) before it is given back like a stalled one: the holder owes
# no bytes before the REQUEST is on the wire, so NO_PROGRESS_TIMEOUT_S and the rate window start
# then (a busy holder answers a stream's opening late, without being dead). Over
# STREAM_NEGOTIATION_TIMEOUT_S, whose StreamOpenTimeout (also given back, the holder kept: its
# connection is up) comes first; this is the backstop.
OPEN_TIMEOUT_S = 45.0
# Requests one node keeps open to one holder at once, over all its transfers (each takes one
# of the holder's slots; more wait in the node, queued, not at the holder): under
# MAX_SERVED_STREAMS_PER_PEER, so an honest node is never answered BUSY. Several transfers run
# at once in a round (one per member whose update a node fetches), each with
# MAX_IN_FLIGHT_PER_HOLDER workers per holder: at 16 members they opened up to 30 streams to
# one holder, and the holder's streams then shared its upload 30 ways.
MAX_STREAMS_PER_HOLDER = 4
# Seconds a worker waits after a holder answered BUSY before it asks again (backpressure: the
# request goes back to the queue, the holder is kept).
BUSY_RETRY_S = 0.5
# Blocks' worth of MAX_BLOCK_SIZE asked for in one request by the scheduler, by their expected
# bytes (a block of unknown size counts as MAX_BLOCK_SIZE): 8 MiB, small enough to bound the
# tail on a slow holder; a request of small blocks names up to MAX_REQUEST_CIDS of them.
BATCH_BLOCKS = 8
# ... or, from a holder that has shown a rate, what it delivers in this many seconds (up to
# MAX_REQUEST_CIDS): a fast holder's requests then outlast the round trips each one costs.
REQUEST_TARGET_S = 0.25
# Expected bytes below which what is left of a fetch is not split further over workers and
# holders (nor a request's tail moved by the end game unless its holder is much slower): a
# request costs a stream's turn, a round trip and py-libp2p's framing, several ms of CPU on
# each side, as long as ~256 KiB takes on the wire at tens of MB/s. At 16 members a node made
# ~33 requests per member per round, most of a few KB, split so over every holder's workers
# (issue 41: fewer, larger requests per member).
MIN_SPLIT_BYTES = 256 * 1024
# Holders put to work beyond what a fetch's bytes need (_batching.needs_another_holder): one, to
# take over a slow holder's work in the end game. The others named wait their turn (issue 41: a
# one-block fetch asked of the aggregator then all 31 other members ran 64 workers, each woken
# at every change of the fetch, most of a 32-member node's scheduling).
HEDGE_HOLDERS = 1
# End game: a holder this many times slower than an idle one loses all its undelivered blocks
# to it, the one on the wire included (see _scheduler._steal).
STEAL_SLOWER_FACTOR = 4.0
# ... but only once it has had this long since its first request: a holder whose first block is
# still arriving has delivered nothing yet, which says nothing of its speed.
STEAL_MIN_OBSERVED_S = 1.0
# A request that receives no byte from its holder (on any of the transfer's streams to it) for
# this long is given back: its blocks return to the queue, the holder is kept (a slow holder is
# not a dead one; MIN_SOURCE_RATE decides, over SOURCE_RATE_WINDOW_S, whether it is too slow).
NO_PROGRESS_TIMEOUT_S = 10.0
# ... checked this often, and only while another holder could take the work (idle, or sending):
# with nowhere better to go a quiet request runs on, bounded by the holder's rate (issue 41).
STALL_CHECK_S = 1.0
# A source (a holder or a gateway) with a request in flight that delivers fewer than
# MIN_SOURCE_RATE bytes per second over SOURCE_RATE_WINDOW_S (bytes received on the wire, block
# bytes or not) is dropped for the transfer and its work moved, whether or not it sends bytes:
# a trickle resets NO_PROGRESS_TIMEOUT_S forever. 16 KiB/s is 1/1000 of what one honest holder
# delivers on loopback and well under any link a run can use; 20 s lets a 1 MiB block at that
# rate, a slow dial and admission fit. Rates are checked every SOURCE_RATE_WINDOW_S / 4.
MIN_SOURCE_RATE = 16 * 1024
SOURCE_RATE_WINDOW_S = 20.0
# ... but a source under the rate is dropped at once only when another source of the transfer
# met MIN_SOURCE_RATE over the same window (its work has somewhere better to go). When none did,
# it is kept (a slow holder is not a dead one: at 16 members on one machine every holder of an
# update was busy scoring for 20 s and dropped, and the update was never scored) and dropped
# only after this many slow windows in a row: 60 s, the longest a round's phase waits for a
# fetch (ROUND_FETCH_S), so a lone trickler still cannot hold a fetch for longer than that.
LONE_SLOW_WINDOWS = 3
# TESTING AID ONLY (``cnode train --attack busy_holder``): seconds a holder sends nothing from
# its first request on. Over SOURCE_RATE_WINDOW_S and its check interval (before issue 41 every
# requester dropped such a holder, sole holder of its update), under LONE_SLOW_WINDOWS windows
# and the round's ROUND_FETCH_S (a holder this busy is now waited for).
BUSY_HOLDER_TEST_S = 30.0
# A requester that sends no complete REQUEST frame within this time is answered BUSY and its
# stream closed (it frees a slot of MAX_SERVED_STREAMS_PER_PEER). Long: an honest requester's
# REQUEST can wait behind its own block data on the connection, and on a loaded machine that
# took over 10 s (issue 41, 12 members).
REQUEST_READ_TIMEOUT_S = 30.0
# A stream carries several requests, one after another (specs/blocks.md#interaction): every new
# stream costs a multiselect negotiation, a close and several small Noise-encrypted writes on both
# sides (py-spy at 32 members: ~17% of a node's CPU went to opening, negotiating and closing one
# stream per request). A holder closes a stream that brings no next REQUEST within this time,
# quietly (an idle pooled stream is not a late request: no BUSY); shorter than
# REQUEST_READ_TIMEOUT_S, which bounds only a stream's first REQUEST. A minute: a member asks
# each other member again at each stage of a round (its slice, its output, its result, the
# verification), and at 32 members on one machine stages are 20-50 s apart; with 12 s two
# requests in three opened a new stream (issue 41, fifth pass). An idle stream costs the holder
# one waiting task, and a peer's streams stay bounded by MAX_SERVED_STREAMS_PER_PEER.
POOLED_STREAM_IDLE_S = 60.0
# ... and a requester takes an idle stream from its pool for a next request only this long after
# its last request ended (older ones are closed): POOLED_STREAM_IDLE_S less a margin for the
# REQUEST's way to the holder, so a holder rarely closes a stream as it is taken (one that did
# is replaced by a fresh stream, once, without blaming the holder).
POOLED_STREAM_MAX_AGE_S = 50.0
# Largest yamux frame we send, its 12-byte header included (defect 12): one Noise transport
# message (65535 bytes minus the 16-byte Poly1305 tag), so a frame is never split in two
# messages. py-libp2p's own (65536) makes every full frame two Noise messages.
YAMUX_MAX_FRAME = 65535 - 16
# Bytes read from a TCP connection per socket read, served to Noise from a buffer (defect 13):
# several Noise messages per read instead of at least two reads per message.
TCP_READ_AHEAD = 256 * 1024
# Pieces in which a block is written to a stream (and taken from the upload token bucket): one
# yamux frame's payload, so each piece is one frame and one Noise message (64 KiB made two
# frames, the second of 29 bytes).
SEND_PIECE = YAMUX_MAX_FRAME - 12
# An uncapped holder answers a request whose whole answer (BLOCK frames, LACKING, END) fits in
# this many bytes with one write: one yamux frame and one Noise message, where a write per frame
# made each 1-2 block request of a round three to five (specs/blocks.md#interaction, 6). Each
# stream write costs both ends together ~1 ms of Python (yamux, Noise, trio), more than the bytes.
COALESCED_ANSWER_BYTES = SEND_PIECE

# -- /cnode/admit/1.0.0 (specs/blocks.md#admission) ----------------------------------------------

# Largest ADMIT frame body: one access token (auth's own bound on a token).
MAX_ADMIT_TOKEN = MAX_TOKEN_SIZE
# Peers a node remembers as admitted (the least recently admitted are forgotten first; they
# show their token again).
MAX_ADMITTED_PEERS = 4096
# A token shown to a holder is shown again when it has less than this many seconds left (the
# coordinator client renews its token a minute before expiry).
ADMIT_RENEW_S = 30.0
# Seconds a holder waits for the ADMIT frame (then answers BUSY: the requester asks again), and a
# requester for the answer (then gives the request back). 10 s was too short on a loaded machine
# at 16 members (issue 41).
ADMIT_TIMEOUT_S = 30.0

# -- announcements over gossipsub (specs/announce.md#limits) -------------------------------------

# Largest announcement envelope published or accepted (gossipsub itself drops > 1 MiB silently).
MAX_ANNOUNCEMENT_SIZE = 64 * 1024
# Most layer names one "hold manifest" announcement may list.
MAX_ANNOUNCED_LAYERS = 1024
# Longest run id / layer name in an announcement.
MAX_ANNOUNCE_STRING = 512
# An announcement older (or newer) than this many seconds by its own clock is dropped.
MAX_ANNOUNCE_SKEW_S = 600
# A node repeats its "hold" announcements when the run's topic gained a subscriber since its last
# repeat (checked every REANNOUNCE_CHECK_S), else every REANNOUNCE_HOLD_S (gossipsub keeps no
# history; issue 41: a 30 s timer for everyone was most of a 16-member swarm's gossip). Each
# repeat is a fresh announcement: new counter, new clock.
REANNOUNCE_CHECK_S = 2.0
REANNOUNCE_HOLD_S = 120.0
# Most manifests a node keeps re-announcing (the latest announced; older ones stop).
MAX_REANNOUNCED_HOLDS = 16
# Most CIDs tracked in the holder table (oldest forgotten first), and holders per CID.
MAX_HOLDER_TABLE_CIDS = 4096
# Peers whose failed dial a node remembers (``_reach.DialMemory``), the oldest forgotten first:
# a run's members, with room; a forgotten one costs one more failed dial, nothing else.
MAX_FAILED_DIALS = 4096
MAX_HOLDERS_PER_CID = 256

# -- gossipsub settings that work around py-libp2p 0.8.1 defaults (see _defects/) --------------

# Heartbeat interval; the library default of 120 s leaves a fresh mesh empty for two minutes.
GOSSIP_HEARTBEAT_S = 1
# The mesh (specs/announce.md#gossipsub-mesh): D peers per topic, grafted up to D when under
# D_LOW, pruned down to D when over D_HIGH. A swarm of up to D_HIGH + 1 members (every member
# connected to every other) keeps all of them in its mesh and never prunes; a larger one is
# pruned to D, and any announcement still reaches every member in two hops at 64 members
# (8 x 8). Announcements are small and few (a handful per member per round), so the extra
# copies a wide mesh forwards cost nothing beside one block.
GOSSIP_D = 8
GOSSIP_D_LOW = 6
GOSSIP_D_HIGH = 16
# Seconds a pruned peer is not grafted again (by either side; defect 18), the spec's minute.
GOSSIP_PRUNE_BACKOFF_S = 60
# Per-topic message rate accepted from one peer (library default 10/s also throttles our own).
GOSSIP_MAX_MSGS_PER_TOPIC_PER_S = 200.0
# Our own publishes are paced to at most this many per second, under the per-peer outbound
# queue of 32 messages that py-libp2p drops beyond, silently.
PUBLISH_MAX_PER_S = 50.0
# Messages buffered for a local subscriber before the oldest are dropped (and counted).
SUBSCRIBER_BUFFER = 1024

# -- host ----------------------------------------------------------------------------------------

# Inbound connections a listener keeps open at once (live ones; closed ones free their slot).
MAX_INBOUND_CONNECTIONS = 512

# Seconds one yamux frame's write to the connection may take once started (defect 19): it runs
# shielded, whole or not at all, so a cancellation cannot cut a Noise message; a write still
# unfinished then means a wedged connection, which is closed.
CONN_WRITE_BOUND_S = 30.0
# Seconds a stream reset may spend sending its frame (defect 11: on a wedged connection it would
# wait forever, inside a shielded scope that no caller's timeout can cancel).
STREAM_RESET_S = 2.0
# Seconds gossipsub keeps a message queued for a connected peer that has not (yet) subscribed to
# its topic (defect 5): enough for the subscription hello that follows a connection (what it
# misses, our republishes resend), short enough that a peer that never subscribes collects at
# most PUBLISH_MAX_PER_S x this (py-libp2p's default: 30 s, capped at 100 with a warning each).
GOSSIP_PENDING_TTL_S = 1.0

# Trustless HTTP gateway (specs/gateway.md#limits): requests served at once (more: HTTP 429), and
# the most blocks one CAR response walks (a checkpoint of MAX_TOTAL_BYTES has ~2M chunks).
GATEWAY_MAX_REQUESTS = 64
GATEWAY_MAX_CAR_BLOCKS = 4_000_000
# Seconds a gateway run beside trio (cnode train) may take to start or to stop.
GATEWAY_STOP_S = 10.0
# Gateway client: largest CAR body accepted for one block (dag-scope=block): header + one section.
GATEWAY_MAX_BLOCK_CAR = 64 * 1024 + MAX_BLOCK_SIZE + 64

# Distinct peers the node's traffic counters keep apart (``_traffic.Traffic``, its /metrics);
# the rest are counted together as "other", so peer ids from the network cannot grow them.
MAX_TRAFFIC_PEERS = 256

# -- per-RPC costs of py-libp2p's receive path (defects 21-24, see _defects/_rpc.py) -------------

# Peers whose last accepted signed peer record a host remembers (defect 21): one entry each, the
# least recently seen forgotten first (a forgotten peer's next record is checked in full).
SENDER_RECORD_PEERS = 1024
# Seconds a remembered record spares the full check: after it the record is checked and stored
# again, as py-libp2p does on every RPC, so the peerstore's 2 h entry is still refreshed.
SENDER_RECORD_RECHECK_S = 60.0
# Bytes pubsub's frame reader asks its stream for at once (defect 23): the length prefix and a
# small frame come in one read, not one read per byte of the varint.
PUBSUB_READ_AHEAD = 64 * 1024
# Seconds our own signed peer record, as sent in every pubsub RPC, is reused before the host's
# addresses are compared with it again (defect 24).
LOCAL_RECORD_RECHECK_S = 1.0
