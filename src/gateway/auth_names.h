// The auth module's names the gateway's request path uses, unqualified inside the gateway.
// Private to the gateway module.
#pragma once

#include "auth/auth.h"

namespace flotilla::gateway {

using auth::Authenticator;
using auth::AuthResult;
using auth::scope_metrics;

}  // namespace flotilla::gateway
