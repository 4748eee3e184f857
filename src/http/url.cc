// http:// and https:// URLs (http.h): the store's downloads and the trace exporter's collector.
#include <algorithm>

#include "http/http.h"

namespace flotilla::http {

std::string Url::text() const {
  return std::string(tls ? "https://" : "http://") + host + ":" + std::to_string(port) + target;
}

Result<Url> parse_url(std::string_view text) {
  Url url;
  std::string_view rest;
  if (text.starts_with("http://")) {
    rest = text.substr(7);
  } else if (text.starts_with("https://")) {
    url.tls = true;
    rest = text.substr(8);
  } else {
    return invalid_argument("'" + std::string(text) + "' is not an http:// or https:// URL");
  }
  if (rest.find('#') != std::string_view::npos) {
    return invalid_argument("URL '" + std::string(text) + "': a fragment is not allowed here");
  }
  const size_t slash = rest.find('/');
  const std::string_view authority = rest.substr(0, slash);
  url.target = slash == std::string_view::npos ? "/" : std::string(rest.substr(slash));
  if (authority.find('@') != std::string_view::npos) {
    return invalid_argument("URL '" + std::string(text) +
                            "': credentials in URLs are not supported");
  }
  std::string_view host = authority;
  url.port = url.tls ? 443 : 80;
  if (const size_t colon = authority.rfind(':');
      colon != std::string_view::npos && authority.find(']') == std::string_view::npos) {
    host = authority.substr(0, colon);
    const std::string_view port = authority.substr(colon + 1);
    unsigned value = 0;
    if (port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        (value = static_cast<unsigned>(std::stoul(std::string(port)))) == 0 || value > 65535) {
      return invalid_argument("URL '" + std::string(text) + "': bad port '" + std::string(port) +
                              "'");
    }
    url.port = static_cast<uint16_t>(value);
  }
  if (host.empty()) {
    return invalid_argument("URL '" + std::string(text) + "' has no host");
  }
  url.host = std::string(host);
  return url;
}

}  // namespace flotilla::http
