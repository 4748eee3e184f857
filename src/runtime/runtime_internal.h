// Private to the runtime module: the loaders of each runtime.
#pragma once

#include "runtime/runtime.h"

namespace flotilla::runtime {

Result<std::unique_ptr<Runtime>> load_xgboost_runtime(const std::string& path,
                                                      const RuntimeOptions& options);
Status warm_up_xgboost();
Result<std::unique_ptr<Runtime>> load_synthetic_runtime(const std::string& path,
                                                        const RuntimeOptions& options);
Result<std::unique_ptr<Runtime>> load_llm_runtime(const std::string& path,
                                                  const RuntimeOptions& options);

}  // namespace flotilla::runtime
