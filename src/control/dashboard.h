// The dashboard's files (src/control/dashboard/ and Debian's Chart.js), embedded in the binary
// at build time: the control plane serves them at /dashboard/ with nothing fetched from
// elsewhere. Private to the control module.
#pragma once

#include <span>
#include <string_view>

namespace flotilla::control {

struct DashboardAsset {
  std::string_view name;  // under /dashboard/: "index.html", "dashboard.js", ...
  std::string_view body;
};

std::span<const DashboardAsset> dashboard_assets();

}  // namespace flotilla::control
