// Traces (trace.h): the W3C traceparent rules, parent-based sampling, the OpenTelemetry
// environment variables, the OTLP/JSON body, and the tracer posting batches to a collector
// (a flotilla http::Server on 127.0.0.1) with its queue bound and drop counter.
#include "trace/trace.h"

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fakes/http/running_server.h"
#include "http/http.h"

namespace flotilla::trace {
namespace {

using namespace std::chrono_literals;

constexpr const char* kParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceparentTest, ParsesAndFormatsTheW3cExample) {
  std::optional<SpanContext> context = parse_traceparent(kParent);
  ASSERT_TRUE(context.has_value());
  EXPECT_EQ(context->trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(context->span_id, 0x00f067aa0ba902b7u);
  EXPECT_TRUE(context->sampled());
  EXPECT_EQ(format_traceparent(*context), kParent);
  // A later version is read for its first four fields (the spec's forward compatibility).
  std::optional<SpanContext> later =
      parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-more");
  ASSERT_TRUE(later.has_value());
  EXPECT_FALSE(later->sampled());
}

TEST(TraceparentTest, RefusesWhatTheSpecCallsInvalid) {
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",       // no flags
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // upper case
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero parent id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // version ff
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",  // extra on version 00
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // wrong separator
           "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",    // not hex
       }) {
    EXPECT_FALSE(parse_traceparent(bad).has_value()) << bad;
  }
}

TracerOptions options_for(const std::string& endpoint, double ratio = 1.0) {
  TracerOptions options;
  options.endpoint = endpoint;
  options.sample_ratio = ratio;
  options.service_name = "test-service";
  options.schedule_delay = 20ms;
  return options;
}

TEST(TracerTest, ServerSpansFollowTheParentOrTheRatio) {
  MetricsRegistry registry;
  // The collector is never reached here: nothing is recorded.
  auto none = Tracer::start(options_for("http://127.0.0.1:9/v1/traces", 0.0), registry);
  ASSERT_TRUE(none.is_ok()) << none.status().message();
  const auto now = SteadyClock::now();
  Span child = (*none)->server_span(kParent, "POST /x", now);
  EXPECT_EQ(child.context.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(child.parent_span_id, 0x00f067aa0ba902b7u);
  EXPECT_NE(child.context.span_id, child.parent_span_id);
  EXPECT_TRUE(child.context.sampled()) << "the parent's decision wins over ratio 0";
  EXPECT_EQ(child.kind, SpanKind::kServer);
  Span unsampled_parent = (*none)->server_span(
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "POST /x", now);
  EXPECT_FALSE(unsampled_parent.context.sampled());
  int sampled = 0;
  for (int i = 0; i < 200; ++i) {
    Span root = (*none)->server_span("", "POST /x", now);
    EXPECT_EQ(root.parent_span_id, 0u);
    sampled += root.context.sampled() ? 1 : 0;
  }
  EXPECT_EQ(sampled, 0);

  auto half = Tracer::start(options_for("http://127.0.0.1:9/v1/traces", 0.5), registry);
  ASSERT_TRUE(half.is_ok());
  sampled = 0;
  for (int i = 0; i < 4000; ++i) {
    sampled += (*half)->server_span("", "POST /x", now).context.sampled() ? 1 : 0;
  }
  // Binomial(4000, 0.5): 12 standard deviations either side.
  EXPECT_GT(sampled, 1600);
  EXPECT_LT(sampled, 2400);
}

TEST(TracerOptionsTest, ReadsOpenTelemetryVariables) {
  for (const char* name : {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT",
                           "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                           "OTEL_TRACES_SAMPLER_ARG", "OTEL_SERVICE_NAME",
                           "OTEL_RESOURCE_ATTRIBUTES", "OTEL_BSP_SCHEDULE_DELAY"}) {
    ::unsetenv(name);
  }
  auto off = tracer_options_from_env("flotilla-x", "", -1);
  ASSERT_TRUE(off.is_ok());
  EXPECT_FALSE(off->has_value()) << "no endpoint: tracing is off";

  ::setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/", 1);
  ::setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=a%20b, x=1", 1);
  ::setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X=2", 1);
  ::setenv("OTEL_TRACES_SAMPLER_ARG", "0.25", 1);
  ::setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.name=ignored", 1);
  ::setenv("OTEL_BSP_SCHEDULE_DELAY", "250", 1);
  auto on = tracer_options_from_env("flotilla-x", "", -1);
  ASSERT_TRUE(on.is_ok()) << on.status().message();
  ASSERT_TRUE(on->has_value());
  const TracerOptions& options = **on;
  EXPECT_EQ(options.endpoint, "http://collector:4318/v1/traces");
  EXPECT_EQ(options.headers,
            (std::vector<std::pair<std::string, std::string>>{{"api-key", "a b"}, {"X", "2"}}));
  EXPECT_DOUBLE_EQ(options.sample_ratio, 0.25);
  EXPECT_EQ(options.service_name, "flotilla-x");
  EXPECT_EQ(options.resource_attributes,
            (std::vector<std::pair<std::string, std::string>>{{"deployment.environment", "prod"}}));
  EXPECT_EQ(options.schedule_delay, 250ms);

  ::setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://other:4318/custom", 1);
  auto traces = tracer_options_from_env("flotilla-x", "", 1.0);
  ASSERT_TRUE(traces.is_ok());
  EXPECT_EQ((*traces)->endpoint, "http://other:4318/custom") << "used as is";
  EXPECT_DOUBLE_EQ((*traces)->sample_ratio, 1.0) << "the flag wins";
  auto flag = tracer_options_from_env("flotilla-x", "http://flag:1/v1/traces", -1);
  ASSERT_TRUE(flag.is_ok());
  EXPECT_EQ((*flag)->endpoint, "http://flag:1/v1/traces");

  for (auto [name, value] : std::vector<std::pair<const char*, const char*>>{
           {"OTEL_TRACES_SAMPLER_ARG", "1.5"},
           {"OTEL_TRACES_SAMPLER_ARG", "half"},
           {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "grpc://collector:4317"},
           {"OTEL_EXPORTER_OTLP_HEADERS", "novalue"},
           {"OTEL_BSP_SCHEDULE_DELAY", "-5"}}) {
    const char* before = std::getenv(name);
    const std::string saved = before ? before : "";
    ::setenv(name, value, 1);
    auto bad = tracer_options_from_env("flotilla-x", "", -1);
    EXPECT_FALSE(bad.is_ok()) << name << "=" << value;
    if (!bad.is_ok()) {
      EXPECT_NE(bad.status().message().find(name), std::string::npos) << bad.status().message();
    }
    ::setenv(name, saved.c_str(), 1);
  }
  for (const char* name :
       {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        "OTEL_TRACES_SAMPLER_ARG", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_BSP_SCHEDULE_DELAY"}) {
    ::unsetenv(name);
  }
}

TEST(OtlpJsonTest, EncodesIdsTimesKindsAttributesAndStatus) {
  TracerOptions options = options_for("http://c/v1/traces");
  options.resource_attributes = {{"k", "v"}};
  Span span = child_span(*parse_traceparent(kParent), "upstream", SpanKind::kClient,
                         SteadyClock::time_point(1000ns));
  span.end = SteadyClock::time_point(3500ns);
  span.set("text", "a\"b");
  span.set("count", int64_t{1} << 40);
  span.set("ratio", 0.5);
  span.set("flag", true);
  span.error = true;
  span.status_message = "HTTP 502";
  const nlohmann::json body =
      nlohmann::json::parse(encode_otlp_json({span}, options, std::chrono::nanoseconds(10)));
  const nlohmann::json& resource = body["resourceSpans"][0]["resource"]["attributes"];
  EXPECT_EQ(resource[0]["key"], "service.name");
  EXPECT_EQ(resource[0]["value"]["stringValue"], "test-service");
  EXPECT_EQ(resource[1]["key"], "k");
  const nlohmann::json& encoded = body["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
  EXPECT_EQ(encoded["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(encoded["parentSpanId"], "00f067aa0ba902b7");
  EXPECT_EQ(encoded["spanId"].get<std::string>().size(), 16u);
  EXPECT_EQ(encoded["kind"], 3);
  EXPECT_EQ(encoded["startTimeUnixNano"], "1010");
  EXPECT_EQ(encoded["endTimeUnixNano"], "3510");
  EXPECT_EQ(encoded["attributes"][0]["value"]["stringValue"], "a\"b");
  EXPECT_EQ(encoded["attributes"][1]["value"]["intValue"], "1099511627776");
  EXPECT_EQ(encoded["attributes"][2]["value"]["doubleValue"], 0.5);
  EXPECT_EQ(encoded["attributes"][3]["value"]["boolValue"], true);
  EXPECT_EQ(encoded["status"]["code"], 2);
  EXPECT_EQ(encoded["status"]["message"], "HTTP 502");
}

// A collector: a server that keeps every body posted to /v1/traces and answers `status`.
class Collector {
 public:
  explicit Collector(int status = 200)
      : status_(status), server_([this](http::Request&& request, http::Responder&& responder) {
          {
            MutexLock lock(mutex_);
            bodies_.push_back(request.body);
            headers_ = request.headers;
          }
          responder.send(http::Response{
              request.target == "/v1/traces" ? status_ : 404, "application/json", "{}", {}});
        }) {}
  std::string url() const {
    return "http://127.0.0.1:" + std::to_string(server_.port()) + "/v1/traces";
  }
  std::vector<nlohmann::json> spans() {
    MutexLock lock(mutex_);
    std::vector<nlohmann::json> spans;
    for (const std::string& body : bodies_) {
      const nlohmann::json parsed = nlohmann::json::parse(body);
      for (const auto& span : parsed["resourceSpans"][0]["scopeSpans"][0]["spans"]) {
        spans.push_back(span);
      }
    }
    return spans;
  }
  size_t posts() {
    MutexLock lock(mutex_);
    return bodies_.size();
  }
  std::string header(const std::string& name) {
    MutexLock lock(mutex_);
    return std::string(http::find_header(headers_, name));
  }

 private:
  const int status_;
  Mutex mutex_;
  std::vector<std::string> bodies_ FLOTILLA_GUARDED_BY(mutex_);
  http::Headers headers_ FLOTILLA_GUARDED_BY(mutex_);
  http::RunningServer server_;  // last: it stops before the members its handler uses go
};

Span finished(const Tracer& tracer, const std::string& name) {
  Span span = tracer.server_span("", name, SteadyClock::now());
  span.end = SteadyClock::now();
  return span;
}

TEST(TracerTest, ExportsSampledSpansInBatchesWithTheConfiguredHeaders) {
  Collector collector;
  MetricsRegistry registry;
  TracerOptions options = options_for(collector.url());
  options.headers = {{"Authorization", "Bearer k"}};
  options.max_batch_spans = 3;
  options.schedule_delay = 10s;  // only full batches and the flush send
  auto tracer = Tracer::start(options, registry);
  ASSERT_TRUE(tracer.is_ok()) << tracer.status().message();
  for (int i = 0; i < 7; ++i) {
    (*tracer)->record(finished(**tracer, "span-" + std::to_string(i)));
  }
  Span unsampled = (*tracer)->server_span("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
                                          "never", SteadyClock::now());
  (*tracer)->record(std::move(unsampled));
  (*tracer)->flush();
  const std::vector<nlohmann::json> spans = collector.spans();
  ASSERT_EQ(spans.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(spans[i]["name"], "span-" + std::to_string(i));
  }
  EXPECT_GE(collector.posts(), 3u) << "batches of at most 3";
  EXPECT_EQ(collector.header("Authorization"), "Bearer k");
  EXPECT_EQ(collector.header("Content-Type"), "application/json");
  EXPECT_NE(registry.render().find("flotilla_trace_spans_exported_total 7"), std::string::npos)
      << registry.render();
}

TEST(TracerTest, AFullQueueDropsAndCountsAndARefusingCollectorIsCounted) {
  Collector collector(400);
  MetricsRegistry registry;
  TracerOptions options = options_for(collector.url());
  options.max_queue_spans = 4;
  options.max_batch_spans = 4;
  options.schedule_delay = 10s;
  auto tracer = Tracer::start(options, registry);
  ASSERT_TRUE(tracer.is_ok());
  // Every span is dropped and counted once: those the full queue refuses, and those the
  // collector refuses (400 is final, not retried).
  for (int i = 0; i < 10; ++i) {
    (*tracer)->record(finished(**tracer, "s"));
  }
  (*tracer)->flush();
  const std::string metrics = registry.render();
  EXPECT_NE(metrics.find("flotilla_trace_spans_dropped_total 10"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("flotilla_trace_spans_exported_total 0"), std::string::npos) << metrics;
  EXPECT_GE(collector.posts(), 1u);
}

TEST(TracerTest, TheDestructorExportsWhatIsQueued) {
  Collector collector;
  MetricsRegistry registry;
  {
    TracerOptions options = options_for(collector.url());
    options.schedule_delay = 10s;  // only the destructor sends
    auto tracer = Tracer::start(options, registry);
    ASSERT_TRUE(tracer.is_ok());
    (*tracer)->record(finished(**tracer, "last"));
  }
  ASSERT_EQ(collector.spans().size(), 1u);
  EXPECT_EQ(collector.spans()[0]["name"], "last");
}

}  // namespace
}  // namespace flotilla::trace
