/*
 * kvcrouter.h - C ABI of libkvcrouter.so (kvc-router), ABI version 1.5.
 *
 * Hand-maintained, and the one definition of the status codes and the ABI
 * version: cabi's Go constants and kvc_router's Python constants are checked
 * against this file by tests (cabi/abi_test.go, tests/test_errors.py).
 * cabi/main.go holds the implementation. Every function is
 * thread-safe, never blocks on network I/O and never calls back into the
 * host. Background work (metrics polling, KV-event subscriptions) runs in
 * goroutines owned by the handle.
 *
 * Versions
 *   The ABI is major.minor: KVR_ABI_VERSION is the major, KVR_ABI_MINOR the
 *   minor. A caller built against major M, minor m works with any library of
 *   major M and minor >= m (check kvr_abi_version() == KVR_ABI_VERSION and
 *   kvr_abi_minor() >= KVR_ABI_MINOR). A minor version only adds: new
 *   functions, new fields at the end of kvr_acquire_opts (whose zero value
 *   means "not used"), new keys in JSON outputs. Anything else is a new
 *   major. kvr_version reports the build.
 *   Minor 1 added kvr_abi_minor, kvr_version, kvr_config_schema, kvr_acquire_with and the
 *   {"key", "reason"} error document of kvr_validate_config.
 *   Minor 2 added router-side admission: kvr_acquire_opts.ticket and .submit,
 *   KVR_HELD and KVR_QUEUE_FULL (returned only to a caller that sets submit),
 *   kvr_release_admit, kvr_pump and kvr_cancel.
 *   Minor 3 added the balancer's document to kvr_router_new and
 *   kvr_validate_config (the configuration as users write it, see
 *   kvr_router_new), the "integration" section, and "metrics_flavors" and
 *   "kv_events_modes" in kvr_config_schema.
 *   Minor 4 added kvr_set_log_fd (the collectors' log as JSON lines on a
 *   descriptor the host reads).
 *   Minor 5 added kvr_release_done (a release naming its request and output
 *   token count, for response-length learning) and "lengths" in the
 *   router's status.
 *
 * Conventions
 *   - Every function but kvr_abi_version, kvr_abi_minor and kvr_free returns a status code
 *     (KVR_OK on success).
 *   - `err`: when non-NULL, *err is set to NULL on entry and, on failure, to
 *     a NUL-terminated UTF-8 message the caller frees with kvr_free.
 *   - Every other char** output is likewise NULL on entry, set only on
 *     success, and freed by the caller with kvr_free.
 *   - Strings are passed as (pointer, length) pairs, need no NUL terminator,
 *     must be valid UTF-8, and are copied; a negative length, or a NULL
 *     pointer with a positive length, is KVR_INVALID_ARGUMENT.
 *   - A Go panic inside any call is recovered and returned as KVR_INTERNAL;
 *     the handle involved is then poisoned: later calls on it return
 *     KVR_POISONED (close it and create a new one).
 *   - One Go runtime per process: do not load a second Go c-shared library,
 *     do not dlclose this one, and do not call it from a fork()ed child of
 *     the process that loaded it.
 */
#ifndef KVCROUTER_H
#define KVCROUTER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVR_ABI_VERSION 1 /* the major version */
#define KVR_ABI_MINOR 5

/* Status codes. */
#define KVR_OK 0
#define KVR_INVALID_ARGUMENT 1 /* bad pointer, length, UTF-8, JSON, prompt size, payload */
#define KVR_NOT_FOUND 2        /* server id not in the pool (push paths) */
#define KVR_INVALID_STATE 3    /* closed or stale handle */
#define KVR_INTERNAL 4         /* a library bug: a recovered Go panic (the handle is then
                                  poisoned) or an error the library could not classify */
#define KVR_POISONED 5         /* the handle saw an earlier panic */
#define KVR_NO_SERVERS 6       /* empty pool: "No available servers in load balancer" */
#define KVR_INVALID_CONFIG 7   /* configuration rejected */
#define KVR_HELD 8             /* kvr_acquire_with with submit: the request is held by
                                  admission (not an error: err and every output unset) */
#define KVR_QUEUE_FULL 9       /* kvr_acquire_with with submit: router.admission.max_queue
                                  requests are already held */

/* Metrics flavors for kvr_update_metrics. */
#define KVR_METRICS_VLLM 0
#define KVR_METRICS_SGLANG 1

/* A runtime/cgo.Handle value; 0 is never valid. */
typedef uint64_t kvr_handle;

/* ABI major version of the loaded library (compare with KVR_ABI_VERSION). */
int32_t kvr_abi_version(void);

/* ABI minor version of the loaded library (at least KVR_ABI_MINOR). */
int32_t kvr_abi_minor(void);

/* The build as JSON: {"version": "<package version>+<commit>",
 * "abi_version": major, "abi_minor": minor, "go_version": "go1.x"}. */
int32_t kvr_version(char **out_json, char **err);

/* What a configuration may name, as JSON: {"router_modes": [...],
 * "strategies": {name: {param: default}}, "targets": {"_target_ string":
 * strategy name} (the allow-list of configuration class names),
 * "collectors": [names], "log_levels": [...], "metrics_flavors": [...] (a
 * flavour's index is its kvr_update_metrics code), "kv_events_modes": [...]}. */
int32_t kvr_config_schema(char **out_json, char **err);

/*
 * Where the collectors' log goes, for every router created afterwards (it is
 * process-wide; routers already created keep theirs). fd >= 0: one JSON
 * object per line ({"time", "level", "msg", attributes...}) written to fd,
 * which the library makes non-blocking and never closes; a line that does
 * not fit (a host that stopped reading a full pipe) is dropped, never
 * waited for. fd < 0: back to the default, logfmt text on stderr. The
 * level is each router's "log_level". KVR_INVALID_ARGUMENT when fd is not
 * an open descriptor.
 */
int32_t kvr_set_log_fd(int32_t fd, char **err);

/* Frees any string returned by the library. NULL is a no-op. */
void kvr_free(void *p);

/*
 * Creates a router from a JSON object (every key optional, unknown keys are
 * errors):
 *   {"router":     {"mode": "default" | "kvc_aware", "sticky_max_size": N,
 *                   "strategies": [{"name", "weight", "params"}], ...},
 *    "collectors": {"collectors": [{"name": "vllm_metrics" | "vllm_polling" |
 *                   "sglang_metrics" | "vllm_zmq", "interval_ms", ...}]},
 *    "max_procs":  N   (> 0 calls runtime.GOMAXPROCS for the whole process),
 *    "log_level":  "debug" | "info" | "warn" | "error",
 *    "push":       {"max_metrics_bytes": N, "max_event_bytes": N},
 *    "integration": {"kv_events", "metrics_flavor", ...}}
 *   ("integration" holds keys only the Python package acts on; the library
 *   checks them and reports their defaults.)
 * Or, since ABI 1.3, the Python balancer's document (recognised by its
 * router_config key): {"router_config": <the configuration as users write
 * it: verl's router block {"type", "config"}, {"router": block}, a whole
 * verl configuration, a router type, null, or the bare "config" mapping>,
 * "max_cache_size": N (the sticky size when the configuration sets none),
 * "sync_balancer": true|false (true refuses admission.enabled)}. Its error
 * keys are paths in router_config as the user wrote it
 * (router.config.strategies[0].alpha). docs/configuration.md lists every key.
 * The pool starts empty. On success *out_handle is non-zero.
 */
int32_t kvr_router_new(const char *cfg_json, int64_t cfg_len, kvr_handle *out_handle, char **err);

/*
 * Validates a configuration exactly as kvr_router_new would, without creating
 * anything (no handle, no goroutines, no GOMAXPROCS change): the status-style
 * call for a configuration rather than a router. cfg_json may be empty (the
 * default configuration). On success, when out_json is non-NULL, it receives
 * the effective configuration: the same JSON shape with every default filled
 * in, including each strategy's full "params" -- so
 * kvr_validate_config("{\"router\":{\"mode\":\"kvc_aware\"}}") reports the
 * kvc_aware defaults. This library is the one place defaults live.
 * A rejected configuration is KVR_INVALID_CONFIG and *err starts with the key
 * path at fault, from the document's root, then ": " and the reason, e.g.
 *   router.strategies[0].params.alpha: must be in [0, 1], got 2
 *   collectors.collectors[1].interval_ms: must not be negative
 * (kvr_router_new reports configuration errors the same way.) Since ABI 1.1,
 * a rejected configuration also sets *out_json, when out_json is non-NULL, to
 * {"key": "<key path>", "reason": "<reason>"} (the one output set on failure).
 */
int32_t kvr_validate_config(const char *cfg_json, int64_t cfg_len, char **out_json, char **err);

/* Stops the collectors and invalidates the handle. Closing twice, or using
 * the handle afterwards, is KVR_INVALID_STATE. */
int32_t kvr_router_close(kvr_handle h, char **err);

/*
 * Routes one request and counts it in flight on the chosen server.
 *   request_id    sticky-session key (may be empty: no binding)
 *   tokens        prompt token ids, borrowed for the duration of the call
 *                 (NULL with n_tokens 0 means no prompt); n_tokens above
 *                 max_prompt_tokens is KVR_INVALID_ARGUMENT
 *   pin           -1, or the full_determinism index (hash % pool size,
 *                 computed by the caller); used for new bindings only
 *   lora          LoRA adapter name (part of the cache-key namespace), may be empty
 *   known_generation  the pool generation the caller has mirrored, or -1
 * Outputs (each optional, NULL = not wanted):
 *   out_index       position of the chosen server in the pool order
 *   out_generation  pool generation the index refers to (see kvr_servers)
 *   out_server      the chosen server id, NUL-terminated (caller frees):
 *                   ids never contain NUL (kvr_add_servers refuses them),
 *                   so strlen gives the whole id; set only when
 *                   known_generation is -1 or differs from the generation,
 *                   so a caller mirroring the pool pays for no string on
 *                   the hot path and is never confused by a concurrent change
 *   out_decision    decision details as JSON (caller frees)
 * An empty pool is KVR_NO_SERVERS.
 */
int32_t kvr_acquire(kvr_handle h, const char *request_id, int64_t request_id_len,
                    const int32_t *tokens, int64_t n_tokens, int64_t pin,
                    const char *lora, int64_t lora_len, int64_t known_generation,
                    int32_t *out_index, int64_t *out_generation,
                    char **out_server, char **out_decision, char **err);

/*
 * kvr_acquire with its inputs in a struct that can grow (ABI 1.1). Set size
 * to sizeof(kvr_acquire_opts) as compiled by the caller: the library reads
 * that many bytes, fields past a smaller size take their defaults (pin -1,
 * lora empty, known_generation -1), and bytes past the fields this library
 * knows must be zero (else KVR_INVALID_ARGUMENT: a newer caller asked for
 * something this library cannot do). size below offsetof(pin) is
 * KVR_INVALID_ARGUMENT. The fields and outputs mean what kvr_acquire's do.
 *
 * ABI 1.2 adds, for router-side admission (router.admission, kvc_aware mode):
 *   ticket   the caller's name for this request should it be held; unique
 *            among the caller's requests held at the same time
 *   submit   0: route now, as kvr_acquire (the default); 1: go through
 *            admission; any other value is KVR_INVALID_ARGUMENT
 * With submit = 1 and admission enabled, a new request is held while no
 * server has room under its in-flight cap (a sticky session while its own
 * server is full): the call returns KVR_HELD with *err and every output
 * unset (out_index -1). The request is then decided later, and listed
 * under its ticket by the kvr_release_admit or kvr_pump call that admits it
 * (already counted in flight there), or dropped by kvr_cancel. When
 * admission.max_queue requests are held the call is KVR_QUEUE_FULL and
 * nothing is held. With admission off, submit = 1 routes as submit = 0.
 */
typedef struct kvr_acquire_opts {
  uint64_t size;
  const char *request_id;
  int64_t request_id_len;
  const int32_t *tokens;
  int64_t n_tokens;
  int64_t pin;
  const char *lora;
  int64_t lora_len;
  int64_t known_generation;
  uint64_t ticket;
  int64_t submit;
} kvr_acquire_opts;

int32_t kvr_acquire_with(kvr_handle h, const kvr_acquire_opts *opts,
                         int32_t *out_index, int64_t *out_generation,
                         char **out_server, char **out_decision, char **err);

/* Counts one request finished on a server. Unknown ids and zero counts are
 * silent no-ops (*out_released = 0); otherwise *out_released = 1. An id no
 * server can have (over 64 KiB, invalid UTF-8, NUL, empty) is unknown too:
 * a no-op counted in kvr_status's "ignored_invalid_ids". */
int32_t kvr_release(kvr_handle h, const char *server_id, int64_t server_id_len,
                    int32_t *out_released, char **err);

/*
 * kvr_release with admission (ABI 1.2): counts one request finished on a
 * server (*out_released as kvr_release) and admits held requests into the
 * room it freed. out_admitted is required (the admitted are counted in
 * flight and only this output names them; NULL is KVR_INVALID_ARGUMENT);
 * *out_admitted stays NULL when nothing was admitted (the common case: no
 * allocation), else it is a JSON array, in admission order, of
 *   {"ticket": T, "index": I, "generation": G, "server": "id"}
 * where index is the server's position in the pool of generation G (as
 * kvr_acquire's out_index and out_generation) and server its id. Each is a
 * request now in flight that its caller must release. server_id is read as
 * kvr_release reads it (an id no server can have is an unknown id). With
 * admission off it is kvr_release.
 */
int32_t kvr_release_admit(kvr_handle h, const char *server_id, int64_t server_id_len,
                          int32_t *out_released, char **out_admitted, char **err);

/*
 * kvr_release_admit for a caller that knows which request finished (ABI
 * 1.5): request_id as given to kvr_acquire / kvr_acquire_with, and the
 * number of tokens it generated (0 = unknown; then the time since its
 * acquire is used). With lengths.enabled the router learns the prompt's
 * response length from it (admission's longest-first order); otherwise it
 * is kvr_release_admit. output_tokens outside [0, 2^24] or a request_id
 * that is not a valid string (over 64 KiB, invalid UTF-8, NULL with a
 * length) is KVR_INVALID_ARGUMENT and nothing is released; an empty
 * request_id learns nothing. server_id and out_admitted as
 * kvr_release_admit's.
 */
int32_t kvr_release_done(kvr_handle h, const char *server_id, int64_t server_id_len,
                         const char *request_id, int64_t request_id_len, int64_t output_tokens,
                         int32_t *out_released, char **out_admitted, char **err);

/* Admits held requests into room that appeared without a release (servers
 * added, caps raised by fresh metrics, a sticky session's server removed);
 * call it periodically while requests are held. out_admitted as
 * kvr_release_admit's (required; NULL when nothing was admitted). */
int32_t kvr_pump(kvr_handle h, char **out_admitted, char **err);

/* Drops a held request (its caller gave up): *out_cancelled = 1, else 0 when
 * the ticket is not held (already admitted -- then its caller must release
 * it -- already cancelled, or never held). */
int32_t kvr_cancel(kvr_handle h, uint64_t ticket, int32_t *out_cancelled, char **err);

/* Adds servers (JSON array of id strings). New ids go to the end of the
 * pool; re-added ids keep their place and their count resets to 0. Every id
 * must be non-empty, at most 64 KiB, valid UTF-8 and free of NUL; the JSON
 * text itself must be valid UTF-8 with no \u escape of an unpaired UTF-16
 * surrogate (a decoder would turn both into U+FFFD, renaming the server).
 * Otherwise KVR_INVALID_ARGUMENT naming the id, and nothing is added. */
int32_t kvr_add_servers(kvr_handle h, const char *ids_json, int64_t len,
                        int64_t *out_generation, char **err);

/* Removes servers (JSON array of ids); unknown ids are ignored. */
int32_t kvr_remove_servers(kvr_handle h, const char *ids_json, int64_t len,
                           int64_t *out_generation, char **err);

/* The pool in order, as a JSON array of ids, and its generation (bumped by
 * every add/remove). */
int32_t kvr_servers(kvr_handle h, char **out_json, int64_t *out_generation, char **err);

/* In-flight count of one server (0 if unknown; an id no server can have
 * is unknown and counted as in kvr_release). */
int32_t kvr_inflight(kvr_handle h, const char *server_id, int64_t server_id_len,
                     int64_t *out, char **err);

/* Sum of in-flight counts over the pool. */
int32_t kvr_total_inflight(kvr_handle h, int64_t *out, char **err);

/* Push path: one Prometheus text scrape for a server (KVR_METRICS_*).
 * Malformed text is KVR_INVALID_ARGUMENT (the previous snapshot is kept);
 * a server not in the pool is KVR_NOT_FOUND. */
int32_t kvr_update_metrics(kvr_handle h, const char *server_id, int64_t server_id_len,
                           const char *text, int64_t text_len, int32_t flavor, char **err);

/* Push path: one raw msgpack KVEventBatch from a server. Malformed payloads
 * are KVR_INVALID_ARGUMENT; a server not in the pool is KVR_NOT_FOUND. The
 * first accepted payload marks the server as having an event feed. */
int32_t kvr_update_events(kvr_handle h, const char *server_id, int64_t server_id_len,
                          const void *payload, int64_t payload_len, char **err);

/* Sets a server's KV-event publishers for the vllm_zmq collector:
 * JSON array of {"endpoint": "tcp://host:port", "replay": "...", "topic": "..."}.
 * Without a vllm_zmq collector configured it is KVR_INVALID_CONFIG. */
int32_t kvr_set_kv_endpoints(kvr_handle h, const char *server_id, int64_t server_id_len,
                             const char *endpoints_json, int64_t len, char **err);

/* Status as JSON: {"abi_version", "generation", "pool": [ids],
 * "router": {mode, strategy, servers: [{id, load: {inflight, ...}}], index, ...},
 * "collectors": {...}, "panics": N, "goroutines": N}. */
int32_t kvr_status(kvr_handle h, char **out_json, char **err);

/* Drops every sticky binding. When out_json is non-NULL it receives
 * {"cleared_entries": N, "server_loads": [{"id", "inflight"}]} in pool order. */
int32_t kvr_clear_sticky(kvr_handle h, char **out_json, char **err);

/* Forgets every cached prefix (after a weight update). */
int32_t kvr_reset_cache(kvr_handle h, char **err);

#ifdef KVR_TEST_BUILD
/* Only in the test build of the library (go build -tags kvrdebug; `make
 * testlib`); the release libkvcrouter.so does not export it. Panics inside Go
 * (kind 0 panic, 1 nil-map write, 2 nil dereference, 3 index out of range),
 * poisoning h when h is a live handle. Kinds 4 and 5 return KVR_OK and arm a
 * panic in a collector goroutine of the process instead: 4 in the next
 * KV-event batch a subscriber applies, 5 in the next /metrics scrape (the
 * collector recovers, counts it and restarts; nothing is poisoned). Any
 * other kind is KVR_INVALID_ARGUMENT. */
int32_t kvr_debug_panic(kvr_handle h, int32_t kind, char **err);
#endif

#ifdef __cplusplus
}
#endif

#endif /* KVCROUTER_H */
