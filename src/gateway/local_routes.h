// The gateway's own routes: health, OIP server metadata, metrics, stats and the OpenAI model
// listing, answered from one snapshot without reaching a replica. Auth is the caller's: it
// checks the route's open-route name and passes the scope a token may see.
//
// Private to the gateway module.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/common.h"
#include "gateway/gateway.h"
#include "gateway/runtime_state.h"
#include "http/http.h"

namespace flotilla::gateway {

// The name under which `auth.open_routes` lists a local route ("" for other routes).
std::string_view open_route_name(RouteKind kind);

// The answer to a local route of `request`, from `snapshot`. `scope`: the endpoints whose series
// and stats the caller may see (empty: all). `draining` makes readiness 503. Any thread; reads
// `registry` (for /metrics) and each endpoint's samples.
http::Response answer_local(const Route& route, const http::Request& request,
                            const Snapshot& snapshot, ErrorShape shape,
                            const std::vector<std::string>& scope, bool draining,
                            MetricsRegistry& registry);

}  // namespace flotilla::gateway
