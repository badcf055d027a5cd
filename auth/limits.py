"""Limits of cnode.auth, shared by code, specs/identity.md#limits and tests."""

# Size of an identity key file: magic (8) + version (1) + key type (1) + seed (32) + public key
# (32).
KEY_FILE_SIZE = 74
# Largest envelope open_envelope reads. Envelopes ride in pubsub messages (the node caps those at
# 64 KiB) and in coordinator HTTP answers (a run state with a few hundred members); 1 MiB, the block
# size, bounds memory and CPU while leaving room for large run states.
MAX_ENVELOPE_SIZE = 1024 * 1024
# Deepest nesting of arrays/maps in an envelope (the envelope map itself is depth 1). Real payloads
# nest 4-5 levels; the bound stops stack exhaustion from hostile input before decoding.
MAX_CBOR_DEPTH = 32
# Most items (array elements + map entries, all levels) in one envelope: bounds decode work.
MAX_CBOR_ITEMS = 200_000
# Longest payload-type string ("cnode/<name>/v<N>").
MAX_PAYLOAD_TYPE_LEN = 64
# Largest access token verify_access_token reads (a token envelope is about 250 bytes).
MAX_TOKEN_SIZE = 4096
# Longest username / run id carried by tokens and bindings (HF usernames are at most 42 chars).
MAX_USERNAME_LEN = 96
MAX_RUN_ID_LEN = 128
# Largest HF binding verify_hf_binding reads (a binding envelope is about 200 bytes).
MAX_BINDING_SIZE = 4096
# Distinct (signer, run[, kind]) keys one ReplayGuard remembers; the oldest are forgotten beyond it.
REPLAY_MAX_KEYS = 100_000
# Most orgs read from one whoami answer.
MAX_HF_ORGS = 1000
