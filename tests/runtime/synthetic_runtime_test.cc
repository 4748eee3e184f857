#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/runtime.h"

namespace flotilla::runtime {
namespace {

using ::testing::HasSubstr;

std::string write_spec(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

Result<std::unique_ptr<Runtime>> load_spec(const std::string& text) {
  RuntimeOptions options;
  options.name = "synthetic";
  return load_runtime(RuntimeKind::kSynthetic, write_spec("spec.yaml", text), options);
}

TEST(SyntheticRuntimeTest, AnswersOneZeroPerRow) {
  auto runtime =
      load_spec("service_time: {dist: exponential, mean_ms: 1}\ncpu_us: 50\nsaturation: 2\n");
  ASSERT_TRUE(runtime.is_ok()) << runtime.status().message();
  InferRequest request;
  request.inputs.push_back(Tensor{"input", DataType::kFp32, {3, 1}, std::vector<uint8_t>(12)});
  auto input = (*runtime)->prepare(request);
  ASSERT_TRUE(input.is_ok());
  EXPECT_FALSE((*runtime)->can_batch());

  // Several concurrent runs all complete, each with its own rows.
  std::mutex mutex;
  std::condition_variable done;
  int completed = 0;
  for (int i = 0; i < 8; ++i) {
    ModelInput copy = *input;
    (*runtime)->run(std::move(copy), [&](Result<std::vector<Tensor>> result) {
      ASSERT_TRUE(result.is_ok());
      EXPECT_EQ(result->at(0).name, "output");
      EXPECT_EQ(result->at(0).shape, (std::vector<int64_t>{3}));
      std::lock_guard lock(mutex);
      ++completed;
      done.notify_all();
    });
  }
  std::unique_lock lock(mutex);
  ASSERT_TRUE(done.wait_for(lock, std::chrono::seconds(30), [&] { return completed == 8; }));
}

// With max_concurrency 2, six 50 ms requests run in three waves, the later ones queued inside
// the runtime; the queue's integral counts their waits (at least 2 x 50 ms + 2 x 100 ms).
TEST(SyntheticRuntimeTest, QueuesPastMaxConcurrencyInArrivalOrder) {
  auto runtime = load_spec("service_time: {dist: fixed, mean_ms: 50}\nmax_concurrency: 2\n");
  ASSERT_TRUE(runtime.is_ok()) << runtime.status().message();
  EXPECT_EQ((*runtime)->queue_wait_seconds(), 0);
  std::mutex mutex;
  std::condition_variable done;
  std::vector<int> finished;
  for (int i = 0; i < 6; ++i) {
    (*runtime)->run(ModelInput{1, 0, {}}, [&, i](Result<std::vector<Tensor>> result) {
      EXPECT_TRUE(result.is_ok());
      std::lock_guard lock(mutex);
      finished.push_back(i);
      done.notify_all();
    });
  }
  std::unique_lock lock(mutex);
  ASSERT_TRUE(done.wait_for(lock, std::chrono::seconds(30), [&] { return finished.size() == 6; }));
  // Timers fire in deadline order on one thread: each wave ends before the next one's.
  for (size_t wave = 0; wave < 3; ++wave) {
    std::vector<int> members(finished.begin() + 2 * wave, finished.begin() + 2 * wave + 2);
    std::sort(members.begin(), members.end());
    EXPECT_EQ(members, (std::vector<int>{2 * int(wave), 2 * int(wave) + 1})) << wave;
  }
  const double waited = (*runtime)->queue_wait_seconds();
  EXPECT_GE(waited, 0.3);
  EXPECT_EQ((*runtime)->queue_wait_seconds(), waited);  // nothing waits any more
}

TEST(SyntheticRuntimeTest, RejectsBadSpecs) {
  EXPECT_THAT(load_spec("service_time: {dist: uniform, mean_ms: 1}\n").status().message(),
              HasSubstr("not fixed, exponential or lognormal"));
  EXPECT_THAT(load_spec("service_time: {dist: fixed, mean_ms: -1}\n").status().message(),
              HasSubstr("mean_ms"));
  EXPECT_THAT(load_spec("cpu_us: lots\n").status().message(),
              HasSubstr("cannot read synthetic model"));
  EXPECT_THAT(load_spec("colour: red\n").status().message(), HasSubstr("unknown field 'colour'"));
  EXPECT_THAT(load_spec("- 1\n- 2\n").status().message(), HasSubstr("YAML mapping"));
  EXPECT_THAT(load_spec("saturation: -3\n").status().message(), HasSubstr("saturation"));
  EXPECT_THAT(load_spec("max_concurrency: -1\n").status().message(),
              HasSubstr("max_concurrency must be >= 0"));
  EXPECT_THAT(
      load_spec("service_time: {dist: lognormal, mean_ms: 1, sigma: 0}\n").status().message(),
      HasSubstr("sigma"));
}

TEST(SyntheticRuntimeTest, RejectsEmptyInput) {
  auto runtime = load_spec("service_time: {dist: fixed, mean_ms: 0}\n");
  ASSERT_TRUE(runtime.is_ok());
  InferRequest request;
  EXPECT_FALSE((*runtime)->prepare(request).is_ok());
  request.inputs.push_back(Tensor{"input", DataType::kFp32, {0, 4}, {}});
  EXPECT_THAT((*runtime)->prepare(request).status().message(), HasSubstr("no rows"));
}

}  // namespace
}  // namespace flotilla::runtime
