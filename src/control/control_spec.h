// Endpoint specs (DESIGN.md §7): parsing from YAML or JSON with errors that name the field,
// the canonical JSON form stored in SQLite and shown by the API, and the numbers derived from a
// spec (deployment key, per-replica concurrency, provisioned replica count). A light part of
// control (flotilla_control_spec): Kubernetes mode's controller (cluster) reads the same spec
// from a ServingEndpoint. Pure: no I/O except check_model_paths(). Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/common.h"

namespace flotilla::control {

struct ConcurrencyRange {
  int64_t min = 0;
  int64_t max = 0;
  bool operator==(const ConcurrencyRange&) const = default;
};

// Per-replica resource limits, applied through cgroup v2 where the machine allows it.
struct Resources {
  double cpus = 0;        // 0: no limit
  int64_t memory_mb = 0;  // 0: no limit
  bool operator==(const Resources&) const = default;
};

// One served model: a version of the endpoint.
struct ServedModelSpec {
  std::string name;              // the version name
  std::string model;             // absolute path (the CLI resolves relative paths)
  std::string runtime = "auto";  // auto | xgboost | llm | synthetic | external
  // runtime external: the user's server that each replica runs (common.h); nullopt otherwise.
  std::optional<ExternalCommand> external;
  ConcurrencyRange concurrency{1, 64};
  // Bounds for the per-replica target concurrency; nullopt: the runtime's defaults.
  std::optional<ConcurrencyRange> per_replica_concurrency;
  // per_replica_concurrency.initial: the target to start from until the autoscaler learns one
  // (nullopt: the runtime's default). Only a starting point: a learned target is kept when it
  // changes, and replicas are not restarted.
  std::optional<int64_t> initial_per_replica_concurrency;
  bool scale_to_zero = false;
  int64_t traffic = 100;  // percent; the served models of an endpoint sum to 100
  Resources resources;
  bool operator==(const ServedModelSpec&) const = default;
};

// How the endpoint's autoscaler runs, beyond each served model's concurrency range.
struct AutoscalingSpec {
  // Raise the replica floor ahead of a peak seen at the same time on past days (issue 21;
  // docs/autoscaler.md, "Forecast"). Never below the range's minimum nor above its maximum.
  bool forecast = true;
  bool operator==(const AutoscalingSpec&) const = default;
};

struct EndpointSpec {
  std::string name;
  std::vector<ServedModelSpec> served_models;
  AutoscalingSpec autoscaling;
  InferenceTableConfig inference_table;  // common.h
  bool operator==(const EndpointSpec&) const = default;
};

// Parses and validates a spec in YAML or JSON (JSON is read as YAML). `name_from_path`, when not
// empty, is the endpoint named by the request URL: the spec may then leave `name` out, and a
// different `name` is an error. Errors (kInvalidArgument) name the field and the problem:
//   "served_models[1].traffic: must be an integer from 0 to 100"
//   "served_models[0]: unknown field 'modle'"
//   "served_models: traffic sums to 90, must be 100"
// Rules: name 1–64 of [A-Za-z0-9-_.] starting with a letter or digit; served_models a non-empty
// list with unique names (same rule); model non-empty, an absolute path or an http(s):// URL (a
// local path with runtime external); runtime one of auto, xgboost, llm,
// synthetic, external; `external` required with runtime external and refused otherwise: command
// a list of 1 to 256 strings, env a mapping of variable names (not PORT) to strings, workdir an
// absolute path, ready_path a path starting with '/', text without control characters;
// concurrency 0 <= min <= max <= 1,000,000, max >= 1; per_replica_concurrency 1 <= min <= max <=
// 4096, its optional initial within [min, max]; traffic an integer in [0, 100], may be left out
// only when there is one served model; resources.cpus in [0, 1024], resources.memory_mb in [0,
// 2^30]; autoscaling.forecast a boolean (default true); inference_table.enabled a boolean,
// .sample_rate in (0, 1], .max_body_bytes in [0, 16 MiB], .retention "<n>m", "<n>h" or "<n>d"
// from 1 minute to 365 days; unknown fields refused at every level.
Result<EndpointSpec> parse_endpoint_spec(std::string_view text,
                                         std::string_view name_from_path = {});

// The canonical JSON form: every field present, defaults filled in except an absent
// per_replica_concurrency, a default `autoscaling` and a default `inference_table`.
// parse_endpoint_spec(to_json(spec).dump()) == spec.
nlohmann::json to_json(const EndpointSpec& spec);
nlohmann::json to_json(const ServedModelSpec& served);

// Fails with kInvalidArgument ("served_models[0].model: '/x/y' does not exist") when a served
// model's path does not exist, or an external server's workdir is not a directory or its
// program cannot be found ("served_models[0].external.command[0]: 'mlserver' is not an
// executable on PATH"). Reads the file system.
Status check_model_paths(const EndpointSpec& spec);

// `runtime: auto` on an MLflow model directory whose flavors Flotilla does not serve natively
// (no xgboost; sklearn, pyfunc, ...): turns the served model into `runtime: external` running
// MLflow's own scoring server (`mlflow models serve -m {model} --env-manager local`, ready on
// /ping), found on this process's PATH, so the stored spec says what runs. kInvalidArgument
// naming the field when `mlflow` is not on PATH (what to install) or the model has no
// python_function flavor. Other served models are left as they are. Reads the file system.
Status serve_mlflow_flavors(EndpointSpec& spec);

// Identifies what a replica of `served` runs: equal keys mean interchangeable replicas. Built
// from the endpoint name and the fields that need a replica restart when they change (name,
// model, runtime, resources) and nothing else, so a change of traffic or concurrency keeps
// the key. Form: "<endpoint>/<version>/<16 hex digits>".
std::string deployment_key(std::string_view endpoint, const ServedModelSpec& served);

// The per-replica concurrency bounds: the spec's, else the runtime's defaults (every runtime
// today: {1, 64}).
ConcurrencyRange per_replica_bounds(const ServedModelSpec& served);

// The per-replica target concurrency until the autoscaler learns it: per_replica_concurrency's
// initial when set, else the runtime's default (xgboost 16, synthetic 8, auto 16), clamped into
// per_replica_bounds(). It is also the cap the
// gateway enforces per replica.
int64_t initial_target_concurrency(const ServedModelSpec& served);

// Replicas to keep ready: max(1, ceil(concurrency.min / initial_target_concurrency)).
int64_t provisioned_replicas(const ServedModelSpec& served);

// The fewest replicas each served model of `spec` can keep ready: with `autoscaled`,
// ceil(concurrency.min / the largest target the endpoint's per-replica bounds allow), at least
// 1 unless it may scale to zero; without, provisioned_replicas(). In spec order.
std::vector<int64_t> least_replicas(const EndpointSpec& spec, bool autoscaled);

// kInvalidArgument naming the field when the served models' least replicas sum to more than
// `cap`, the host-wide cap on replica processes (`flotilla up --max-replicas`); 0: no cap.
//   "served_models[0].concurrency.min: 100000 needs at least 100000 replicas (at most 1 in
//    flight each, per_replica_concurrency.max), more than this host's cap of 64 replicas
//    (flotilla up --max-replicas)"
Status check_replica_cap(const EndpointSpec& spec, int64_t cap, bool autoscaled);

}  // namespace flotilla::control
