// How long replica pods took to start, read from the API server's pod objects.
#include <gtest/gtest.h>

#include "cluster/cluster.h"

namespace flotilla::cluster {
namespace {

using nlohmann::json;

json pod(const std::string& endpoint, const std::string& created, const std::string& ready_at,
         int64_t restarts = 0, const std::string& ready = "True") {
  json object;
  object["metadata"]["name"] = endpoint + "-" + created;
  object["metadata"]["labels"][std::string(kEndpointLabel)] = endpoint;
  object["metadata"]["creationTimestamp"] = created;
  json condition;
  condition["type"] = "Ready";
  condition["status"] = ready;
  condition["lastTransitionTime"] = ready_at;
  object["status"]["conditions"] = json::array({condition});
  json container;
  container["name"] = "replica";
  container["restartCount"] = restarts;
  object["status"]["containerStatuses"] = json::array({container});
  return object;
}

kube::Reflector::Objects objects(std::vector<json> pods) {
  kube::Reflector::Objects by_name;
  for (json& item : pods) {
    const std::string name = item["metadata"]["name"].get<std::string>();
    by_name[name] = std::move(item);
  }
  return by_name;
}

TEST(PodStartsTest, TheNewestReadyPodOfTheEndpoint) {
  const auto pods = objects({
      pod("fraud", "2026-12-03T05:00:00Z", "2026-12-03T05:00:07Z"),    // 7 s, ready first
      pod("fraud", "2026-12-03T05:01:00Z", "2026-12-03T05:01:04.5Z"),  // 4.5 s, the newest
      pod("other", "2026-12-03T05:02:00Z", "2026-12-03T05:02:09Z"),    // another endpoint's
  });
  EXPECT_EQ(newest_pod_start_ms(pods, "fraud"), 4'500);
  EXPECT_EQ(newest_pod_start_ms(pods, "other"), 9'000);
  EXPECT_EQ(newest_pod_start_ms(pods, "none"), std::nullopt);
}

// Not ready, ready again after a restart, or timestamps that cannot be read: no start time.
TEST(PodStartsTest, LeavesOutPodsThatSayNothingOfAStart) {
  EXPECT_EQ(newest_pod_start_ms(
                objects({pod("fraud", "2026-12-03T05:00:00Z", "2026-12-03T05:00:05Z", 0, "False")}),
                "fraud"),
            std::nullopt);
  EXPECT_EQ(
      newest_pod_start_ms(
          objects({pod("fraud", "2026-12-03T05:00:00Z", "2026-12-03T05:09:00Z", 2)}), "fraud"),
      std::nullopt);
  EXPECT_EQ(
      newest_pod_start_ms(objects({pod("fraud", "yesterday", "2026-12-03T05:00:05Z")}), "fraud"),
      std::nullopt);
  // One pod left out beside one that counts: the one that counts.
  EXPECT_EQ(newest_pod_start_ms(
                objects({pod("fraud", "2026-12-03T05:00:00Z", "2026-12-03T05:00:03Z"),
                         pod("fraud", "2026-12-03T05:01:00Z", "2026-12-03T05:09:00Z", 1)}),
                "fraud"),
            3'000);
}

// Restarts as a running count: the first reading is the baseline, a pod gained later counts
// all of its own, and a pod that goes takes nothing back.
TEST(PodRestartsTest, CountsRestartsSinceTheFirstReadingPodByPod) {
  PodRestarts restarts;
  const json a = pod("fraud", "2026-12-03T05:00:00Z", "2026-12-03T05:00:05Z", 3);
  const json other = pod("other", "2026-12-03T05:00:00Z", "2026-12-03T05:00:05Z", 9);
  EXPECT_EQ(restarts.update(objects({a, other}), "fraud"), 0);  // 3 before: the baseline
  json a_again = a;
  a_again["status"]["containerStatuses"][0]["restartCount"] = 5;
  const json b = pod("fraud", "2026-12-03T05:01:00Z", "2026-12-03T05:01:05Z", 1);
  EXPECT_EQ(restarts.update(objects({a_again, b, other}), "fraud"), 3);  // 2 of a's, 1 of b's
  EXPECT_EQ(restarts.update(objects({b}), "fraud"), 3);                  // a deleted
  EXPECT_EQ(restarts.update(objects({b}), "fraud"), 3);
}

}  // namespace
}  // namespace flotilla::cluster
