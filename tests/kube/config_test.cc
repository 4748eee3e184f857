// Connection settings: kubeconfig files as kubectl writes them, the in-cluster service account,
// paths, the backoff, and how API answers become Statuses.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "fakes/common/scripted_random.h"
#include "kube/kube.h"

namespace flotilla::kube {
namespace {

class KubeConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("flotilla-kube-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    std::filesystem::remove_all(dir_);
    ::unsetenv("KUBERNETES_SERVICE_HOST");
    ::unsetenv("KUBERNETES_SERVICE_PORT");
  }
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

// "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n" in base64.
constexpr const char* kCaBase64 =
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=";

TEST_F(KubeConfigTest, ReadsTheCurrentContextsClusterUserAndNamespace) {
  const std::string path = write("config", std::string(R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: other
  cluster: {server: "https://10.0.0.9:6443"}
- name: kind
  cluster:
    server: https://127.0.0.1:40123/prefix/
    certificate-authority-data: )") + kCaBase64 +
                                               R"(
users:
- name: admin
  user: {token: abc.def}
contexts:
- name: dev
  context: {cluster: kind, user: admin, namespace: serving}
- name: prod
  context: {cluster: other, user: admin}
)");
  Result<Config> config = load_kubeconfig(path);
  ASSERT_TRUE(config.is_ok()) << config.status().message();
  EXPECT_EQ(config->server.host, "127.0.0.1");
  EXPECT_EQ(config->server.port, 40123);
  EXPECT_TRUE(config->server.tls);
  EXPECT_TRUE(config->server.tls_options.verify);
  EXPECT_EQ(config->base_path, "/prefix");
  EXPECT_EQ(config->server.tls_options.ca_pem,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  EXPECT_EQ(config->token, "abc.def");
  EXPECT_EQ(config->namespace_name, "serving");

  Result<Config> prod = load_kubeconfig(path, "prod");
  ASSERT_TRUE(prod.is_ok()) << prod.status().message();
  EXPECT_EQ(prod->server.host, "10.0.0.9");
  EXPECT_EQ(prod->server.port, 6443);
  EXPECT_EQ(prod->namespace_name, "default");
}

TEST_F(KubeConfigTest, ReadsFilesRelativeToTheKubeconfigAndSkipsVerificationWhenAsked) {
  write("ca.crt", "CA PEM");
  write("client.crt", "CERT PEM");
  write("client.key", "KEY PEM");
  const std::string path = write("config", R"(current-context: test
clusters:
- name: c
  cluster: {server: "http://localhost", certificate-authority: ca.crt,
            insecure-skip-tls-verify: true}
users:
- name: u
  user: {client-certificate: client.crt, client-key: client.key, tokenFile: token}
contexts:
- name: test
  context: {cluster: c, user: u}
)");
  Result<Config> config = load_kubeconfig(path);
  ASSERT_TRUE(config.is_ok()) << config.status().message();
  EXPECT_FALSE(config->server.tls);
  EXPECT_EQ(config->server.port, 80);
  EXPECT_EQ(config->base_path, "");
  EXPECT_FALSE(config->server.tls_options.verify);
  EXPECT_EQ(config->server.tls_options.ca_pem, "CA PEM");
  EXPECT_EQ(config->server.tls_options.cert_pem, "CERT PEM");
  EXPECT_EQ(config->server.tls_options.key_pem, "KEY PEM");
  EXPECT_EQ(config->token_file, (dir_ / "token").string());
}

TEST_F(KubeConfigTest, RefusesWhatItCannotHonourNamingTheField) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"current-context: x\ncontexts: []\n", "contexts: no entry named 'x'"},
      {"contexts:\n- {name: x, context: {cluster: c}}\n", "no current-context"},
      {"current-context: x\ncontexts:\n- {name: x, context: {cluster: c}}\nclusters:\n"
       "- {name: c, cluster: {server: \"ftp://h\"}}\n",
       "must start with https:// or http://"},
      {"current-context: x\ncontexts:\n- {name: x, context: {cluster: c}}\nclusters:\n"
       "- {name: c, cluster: {server: \"https://h:99999\"}}\n",
       "bad port"},
      {"current-context: x\ncontexts:\n- {name: x, context: {cluster: c, user: u}}\nclusters:\n"
       "- {name: c, cluster: {server: \"https://h\"}}\nusers:\n"
       "- {name: u, user: {exec: {command: aws}}}\n",
       "users['u'].user.exec: not supported"},
      {"current-context: x\ncontexts:\n- {name: x, context: {cluster: c, user: u}}\nclusters:\n"
       "- {name: c, cluster: {server: \"https://h\"}}\nusers:\n"
       "- {name: u, user: {client-certificate-data: \"TUlJQg==\"}}\n",
       "needs its key"},
      {"current-context: x\ncontexts:\n- {name: x, context: {cluster: c}}\nclusters:\n"
       "- {name: c, cluster: {server: \"https://h\", certificate-authority-data: \"%%%\"}}\n",
       "certificate-authority-data: not base64"},
      {"current-context: x\ncontexts:\n- {name: x, context: {cluster: c}}\nclusters:\n"
       "- {name: c, cluster: {server: \"https://h\", certificate-authority: missing.crt}}\n",
       "cannot read"},
      {"clusters: [unclosed\n", "kubeconfig '"},
  };
  for (const Case& c : cases) {
    Result<Config> config = load_kubeconfig(write("config", c.text));
    ASSERT_FALSE(config.is_ok()) << c.text;
    EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(config.status().message().find(c.message), std::string::npos)
        << config.status().message();
  }
  EXPECT_FALSE(load_kubeconfig((dir_ / "absent").string()).is_ok());
}

TEST_F(KubeConfigTest, InClusterReadsTheServiceAccountAndTheEnvironment) {
  EXPECT_EQ(in_cluster_config(dir_.string()).status().code(), StatusCode::kFailedPrecondition);
  ::setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  Result<Config> missing = in_cluster_config(dir_.string());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("token"), std::string::npos);

  write("token", "service-account-token\n");
  write("ca.crt", "CLUSTER CA");
  write("namespace", "serving\n");
  Result<Config> config = in_cluster_config(dir_.string());
  ASSERT_TRUE(config.is_ok()) << config.status().message();
  EXPECT_EQ(config->server.host, "10.96.0.1");
  EXPECT_EQ(config->server.port, 443);
  EXPECT_TRUE(config->server.tls);
  EXPECT_EQ(config->server.tls_options.ca_pem, "CLUSTER CA");
  EXPECT_EQ(config->token_file, (dir_ / "token").string());
  EXPECT_EQ(config->namespace_name, "serving");

  ::setenv("KUBERNETES_SERVICE_HOST", "fd00::1", 1);
  Result<Config> ipv6 = in_cluster_config(dir_.string());
  ASSERT_TRUE(ipv6.is_ok()) << ipv6.status().message();
  EXPECT_EQ(ipv6->server.host, "fd00::1");
}

TEST_F(KubeConfigTest, AFlagsNamespaceWins) {
  const std::string path = write("config", R"(current-context: x
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
contexts: [{name: x, context: {cluster: c, namespace: from-file}}]
)");
  Result<Config> config = resolve_config(path, "from-flag");
  ASSERT_TRUE(config.is_ok()) << config.status().message();
  EXPECT_EQ(config->namespace_name, "from-flag");
  EXPECT_EQ(resolve_config(path, "")->namespace_name, "from-file");
}

TEST(KubePathsTest, BuildsCoreGroupClusterScopedAndSubresourcePaths) {
  EXPECT_EQ(collection_path(kServices, "ns"), "/api/v1/namespaces/ns/services");
  EXPECT_EQ(object_path(kDeployments, "ns", "fraud-v1", "scale"),
            "/apis/apps/v1/namespaces/ns/deployments/fraud-v1/scale");
  EXPECT_EQ(object_path(kServingEndpoints, "ns", "fraud", "status"),
            "/apis/flotilla.dev/v1/namespaces/ns/servingendpoints/fraud/status");
  const Resource crds{"apiextensions.k8s.io", "v1", "customresourcedefinitions", false};
  EXPECT_EQ(object_path(crds, "ignored", "servingendpoints.flotilla.dev"),
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
            "servingendpoints.flotilla.dev");
  EXPECT_EQ(query_escape("kubernetes.io/service-name in (a-v1,b),!x"),
            "kubernetes.io%2Fservice-name%20in%20%28a-v1%2Cb%29%2C%21x");
}

TEST(KubeBase64Test, EncodesWhatDecodeReadsBackForEveryPaddingLength) {
  EXPECT_EQ(encode_base64(""), "");
  EXPECT_EQ(encode_base64("f"), "Zg==");
  EXPECT_EQ(encode_base64("fo"), "Zm8=");
  EXPECT_EQ(encode_base64("foo"), "Zm9v");
  const std::string bytes("\x00\xff\x10token\n", 9);
  Result<std::string> back = decode_base64(encode_base64(bytes), "data.token");
  ASSERT_TRUE(back.is_ok()) << back.status().message();
  EXPECT_EQ(*back, bytes);
}

TEST(KubeReplyTest, MapsStatusObjectsToStatuses) {
  const nlohmann::json conflict = {{"kind", "Status"},
                                   {"status", "Failure"},
                                   {"reason", "Conflict"},
                                   {"message", "the object has been modified"},
                                   {"code", 409}};
  const Reply reply{409, conflict};
  EXPECT_EQ(reply.reason(), "Conflict");
  const Status status = reply_status(reply);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), "the API server answered 409 Conflict: the object has been modified");
  EXPECT_EQ(reply_status({404, {{"kind", "Status"}, {"reason", "NotFound"}}}).code(),
            StatusCode::kNotFound);
  EXPECT_EQ(reply_status({422, nlohmann::json::object()}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reply_status({503, nlohmann::json::object()}).code(), StatusCode::kUnavailable);
  EXPECT_TRUE(reply_status({201, nlohmann::json::object()}).is_ok());
  EXPECT_EQ(Reply({200, {{"kind", "Deployment"}}}).reason(), "");
}

TEST(KubeBackoffTest, DoublesToTheCapWithUpToHalfTakenOffAsJitter) {
  using std::chrono::milliseconds;
  // The draws: no jitter, then the most jitter the delay allows.
  testing::ScriptedRandom none({0, 0, 0, 0});
  EXPECT_EQ(backoff_delay(1, milliseconds(200), milliseconds(1'000), none), milliseconds(200));
  EXPECT_EQ(backoff_delay(2, milliseconds(200), milliseconds(1'000), none), milliseconds(400));
  EXPECT_EQ(backoff_delay(3, milliseconds(200), milliseconds(1'000), none), milliseconds(800));
  EXPECT_EQ(backoff_delay(30, milliseconds(200), milliseconds(1'000), none), milliseconds(1'000));
  testing::ScriptedRandom most({100, 500});
  EXPECT_EQ(backoff_delay(1, milliseconds(200), milliseconds(1'000), most), milliseconds(100));
  EXPECT_EQ(backoff_delay(9, milliseconds(200), milliseconds(1'000), most), milliseconds(500));
}

}  // namespace
}  // namespace flotilla::kube
