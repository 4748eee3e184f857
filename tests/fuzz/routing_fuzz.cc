// The gateway's request routing (gateway::route_request): which endpoint a request is for and
// which path it takes on the replica, from any method, target and body.
// Input: byte 0 picks the method and whether a default endpoint is set; the rest is the target,
// then a newline, then the body.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gateway/gateway.h"

namespace {

using flotilla::gateway::RouteKind;
using flotilla::http::Method;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  static constexpr Method kMethods[] = {Method::kGet,    Method::kPost, Method::kPut,
                                        Method::kDelete, Method::kHead, Method::kOther};
  const Method method = kMethods[(data[0] & 0x7f) % std::size(kMethods)];
  const std::string_view default_endpoint = (data[0] & 0x80) != 0 ? "fallback" : "";
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  const size_t newline = rest.find('\n');
  const std::string_view target = rest.substr(0, newline);
  const std::string_view body =
      newline == std::string_view::npos ? std::string_view() : rest.substr(newline + 1);

  const flotilla::gateway::Route route =
      flotilla::gateway::route_request(method, target, body, default_endpoint);
  switch (route.kind) {
    case RouteKind::kInvocations:
    case RouteKind::kOip:
      // A proxied route names its endpoint and a path on the replica.
      if (route.endpoint.empty() || !route.upstream_target.starts_with('/')) {
        __builtin_trap();
      }
      break;
    case RouteKind::kCatchAll:
      // The default endpoint gets the target as it came (the HTTP parser decides its form).
      if (route.endpoint != default_endpoint || route.upstream_target != target) {
        __builtin_trap();
      }
      break;
    case RouteKind::kOpenAi:
      if (route.upstream_target != target) {
        __builtin_trap();
      }
      break;
    case RouteKind::kBadRequest:
      if (route.error.empty()) {
        __builtin_trap();  // a 400 says why
      }
      break;
    default:
      break;
  }
  return 0;
}
