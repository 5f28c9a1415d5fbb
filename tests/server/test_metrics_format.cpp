// Prometheus text rendering and the OpenAI response/SSE builders, in isolation.
#include <gtest/gtest.h>

#include "engine/metrics_sum.h"
#include "fake_backend.h"
#include "server/metrics.h"
#include "server/openai_format.h"

using namespace tern;
using namespace tern::server;
using nlohmann::json;

TEST(Metrics, HistogramIsCumulative) {
  Histogram h({0.1, 1, 10});
  for (double x : {0.05, 0.1, 0.5, 5.0, 50.0}) h.observe(x);
  EXPECT_EQ(h.counts(), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(h.count(), 5u);
  EXPECT_DOUBLE_EQ(h.sum(), 55.65);
  PrometheusWriter w;
  w.histogram("x_seconds", "help text", h);
  EXPECT_EQ(w.text(),
            "# HELP x_seconds help text\n# TYPE x_seconds histogram\n"
            "x_seconds_bucket{le=\"0.1\"} 2\nx_seconds_bucket{le=\"1\"} 3\nx_seconds_bucket{le=\"10\"} 4\n"
            "x_seconds_bucket{le=\"+Inf\"} 5\nx_seconds_sum 55.65\nx_seconds_count 5\n");
}

TEST(Metrics, LabelsAreEscaped) {
  PrometheusWriter w;
  w.sample("m", {{"a", "x\"y\\z\nw"}}, 1.5);
  EXPECT_EQ(w.text(), "m{a=\"x\\\"y\\\\z\\nw\"} 1.5\n");
  EXPECT_EQ(PrometheusWriter::format_value(1e300 * 1e10), "+Inf");
}

TEST(Metrics, ServerMetricsRenderEngineGauges) {
  ServerMetrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/chat/completions", 429);
  RequestMetrics rm;
  rm.ttft_ms = 12;
  rm.e2e_ms = 40;
  rm.tbt_ms = {5, 6, 7};
  m.observe_completion(rm);
  m.add_tokens(10, 4);
  EngineMetrics em;
  em.n_running = 2;
  em.n_waiting = 3;
  em.kv_blocks_total = 100;
  em.kv_blocks_used = 25;
  em.kv_blocks_free = 75;
  em.prefix_hit_rate = 0.5;
  const std::string t = m.render(em);
  for (const char* line :
       {"tern_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2\n",
        "tern_requests_total{endpoint=\"/v1/chat/completions\",status=\"429\"} 1\n", "tern_prompt_tokens_total 10\n",
        "tern_generation_tokens_total 4\n", "tern_time_to_first_token_seconds_bucket{le=\"0.02\"} 1\n",
        "tern_time_per_output_token_seconds_count 3\n", "tern_num_requests_running 2\n", "tern_num_requests_waiting 3\n",
        "tern_kv_blocks_used 25\n", "tern_kv_blocks_free 75\n", "tern_kv_cache_usage_ratio 0.25\n",
        "tern_prefix_cache_hit_rate 0.5\n"})
    EXPECT_NE(t.find(line), std::string::npos) << line;
  EXPECT_EQ(m.requests("/v1/completions", 200), 2u);
  // Every line is a comment or `name{labels} value`.
  size_t start = 0;
  while (start < t.size()) {
    const size_t end = t.find('\n', start);
    ASSERT_NE(end, std::string::npos);
    const std::string line = t.substr(start, end - start);
    start = end + 1;
    if (line[0] == '#') continue;
    EXPECT_NE(line.find(' '), std::string::npos) << line;
    EXPECT_EQ(line.rfind("tern_", 0), 0u) << line;
  }
}

TEST(Metrics, LatencyObjectivesAndStepTimes) {
  ServerMetrics m;
  EngineMetrics em;
  em.step_ms_counts[0] = 2;    // <= 1 ms
  em.step_ms_counts[6] = 3;    // (40, 60] ms
  em.step_ms_counts.back() = 1;  // > 1 s
  em.step_ms_sum = 1500;
  em.tbt_target_ms = 50;
  em.decode_step_ms = 16;
  em.step_cost_error_p50 = 0.05;
  em.step_cost_error_p90 = 0.125;
  em.steps_over_target = 4;
  em.steps_prefill_cut = 7;
  em.slo_good = 9;
  em.slo_ttft_missed = 2;
  em.slo_tbt_missed = 1;
  em.requests_refused_queue = 3;
  const std::string t = m.render(em);
  for (const char* line :
       {"tern_engine_step_duration_seconds_bucket{le=\"0.001\"} 2\n",
        "tern_engine_step_duration_seconds_bucket{le=\"0.04\"} 2\n",
        "tern_engine_step_duration_seconds_bucket{le=\"0.06\"} 5\n",
        "tern_engine_step_duration_seconds_bucket{le=\"1\"} 5\n",
        "tern_engine_step_duration_seconds_bucket{le=\"+Inf\"} 6\n", "tern_engine_step_duration_seconds_sum 1.5\n",
        "tern_engine_step_duration_seconds_count 6\n", "tern_tbt_target_seconds 0.05\n",
        "tern_decode_step_seconds 0.016\n", "tern_step_cost_relative_error{quantile=\"0.9\"} 0.125\n",
        "tern_engine_steps_over_tbt_target_total 4\n", "tern_engine_steps_prefill_cut_total 7\n",
        "tern_requests_slo_good_total 9\n", "tern_requests_ttft_missed_total 2\n", "tern_requests_tbt_missed_total 1\n",
        "tern_requests_refused_queue_total 3\n"})
    EXPECT_NE(t.find(line), std::string::npos) << line;
}

// Speculative decoding's series: three counters, and two gauges derived from them (0, not NaN,
// before anything was drafted); over several engines (a pool, a swap) the counters add up,
// retired engines' included, so the derived gauges are token-weighted.
TEST(Metrics, SpeculativeDecodingSeries) {
  ServerMetrics m;
  EngineMetrics none;
  const std::string zero = m.render(none);
  for (const char* line : {"tern_spec_draft_tokens_total 0\n", "tern_spec_accepted_tokens_total 0\n",
                           "tern_spec_verify_steps_total 0\n", "tern_spec_acceptance_rate 0\n",
                           "tern_spec_mean_accepted_length 0\n", "# TYPE tern_spec_draft_tokens_total counter\n",
                           "# TYPE tern_spec_acceptance_rate gauge\n"})
    EXPECT_NE(zero.find(line), std::string::npos) << line;

  EngineMetrics a, b, gone;
  a.spec_drafted = 40;
  a.spec_accepted = 30;
  a.spec_steps = 10;
  b.spec_drafted = 20;
  b.spec_accepted = 0;
  b.spec_steps = 5;
  gone.spec_drafted = 40;
  gone.spec_accepted = 10;
  gone.spec_steps = 5;
  gone.spec_draft_ms = 2.5;
  tern::EngineMetricsSum sum;
  sum.retire(gone);
  const EngineMetrics total = sum.total({a, b});
  EXPECT_EQ(total.spec_drafted, 100);
  EXPECT_EQ(total.spec_accepted, 40);
  EXPECT_EQ(total.spec_steps, 20);
  EXPECT_DOUBLE_EQ(total.spec_draft_ms, 2.5);
  const std::string t = m.render(total);
  for (const char* line : {"tern_spec_draft_tokens_total 100\n", "tern_spec_accepted_tokens_total 40\n",
                           "tern_spec_verify_steps_total 20\n", "tern_spec_acceptance_rate 0.4\n",
                           "tern_spec_mean_accepted_length 3\n"})  // (40 + 20) / 20
    EXPECT_NE(t.find(line), std::string::npos) << line;
}

TEST(Format, ResponsesAndChunks) {
  tern::testing::ByteTokenizer tok;
  ResponseMeta meta;
  meta.kind = ApiKind::Chat;
  meta.id = "chatcmpl-1";
  meta.created = 1700000000;
  meta.model = "m";
  meta.system_fingerprint = system_fingerprint_of("config");
  meta.timings = false;
  ChoiceResult c;
  c.index = 0;
  c.text = "hi";
  c.finish = FinishReason::Stop;
  GeneratedToken g;
  g.id = 3 + 'h';
  g.logprob = -0.5f;
  g.top_logprobs = {{3 + 'h', -0.5f}, {3 + 'x', -2.0f}};
  c.tokens = {g};
  Usage u{5, 2, 1};
  const json full = completion_response(meta, {c}, u, true, tok);
  EXPECT_EQ(full["object"], "chat.completion");
  EXPECT_EQ(full["choices"][0]["message"]["content"], "hi");
  EXPECT_EQ(full["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(full["choices"][0]["logprobs"]["content"][0]["top_logprobs"][1]["token"], "x");
  EXPECT_EQ(full["usage"], json({{"prompt_tokens", 5}, {"completion_tokens", 2}, {"total_tokens", 7},
                                  {"prompt_tokens_details", {{"cached_tokens", 1}}}}));
  EXPECT_EQ(role_chunk(meta, 1, false)["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_EQ(finish_chunk(meta, 0, FinishReason::Length, true)["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(finish_chunk(meta, 0, FinishReason::Length, true)["usage"].is_null());
  EXPECT_TRUE(usage_chunk(meta, u)["choices"].empty());
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  // Invalid UTF-8 never throws out of the formatter.
  EXPECT_EQ(sse_event(json{{"a", std::string("\xff")}}), "data: {\"a\":\"\xef\xbf\xbd\"}\n\n");
  meta.kind = ApiKind::Completion;
  const json t = text_chunk(meta, 2, "abc", nullptr, false);
  EXPECT_EQ(t["object"], "text_completion");
  EXPECT_EQ(t["choices"][0]["text"], "abc");
  EXPECT_EQ(t["choices"][0]["index"], 2);
  EXPECT_EQ(new_response_id(ApiKind::Completion).size(), 5u + 24u);
  EXPECT_NE(new_response_id(ApiKind::Chat), new_response_id(ApiKind::Chat));
  const json e = error_json("bad", "invalid_request_error", "n");
  EXPECT_EQ(e, json({{"error", {{"message", "bad"}, {"type", "invalid_request_error"}, {"param", "n"}, {"code", nullptr}}}}));
}

TEST(Format, FingerprintTimingsAndToolCalls) {
  tern::testing::ByteTokenizer tok;
  const std::string fp = system_fingerprint_of("tern 0.1.0|m.gguf|123|f16|4096");
  EXPECT_EQ(fp.size(), 3u + 16u);
  EXPECT_EQ(fp.rfind("fp_", 0), 0u);
  EXPECT_EQ(fp, system_fingerprint_of("tern 0.1.0|m.gguf|123|f16|4096")) << "stable";
  EXPECT_NE(fp, system_fingerprint_of("tern 0.1.0|m.gguf|123|f32|4096")) << "the K/V type is part of it";
  ResponseMeta meta;
  meta.kind = ApiKind::Chat;
  meta.id = "chatcmpl-1";
  meta.created = 1700000000;
  meta.model = "m";
  meta.system_fingerprint = fp;

  RequestMetrics m;
  m.n_prompt = 12;
  m.n_cached_prompt = 4;
  m.queue_ms = 1.0;
  m.ttft_ms = 5.0;  // 4 ms of prefill for 8 computed tokens
  m.n_generated = 3;
  m.tbt_ms = {10.0, 30.0};
  const json t = timings_json(m);
  EXPECT_EQ(t["prompt_n"], 8);
  EXPECT_EQ(t["cache_n"], 4);
  EXPECT_DOUBLE_EQ(t["prompt_ms"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(t["prompt_per_second"].get<double>(), 2000.0);
  EXPECT_EQ(t["predicted_n"], 3);
  EXPECT_DOUBLE_EQ(t["predicted_ms"].get<double>(), 40.0);
  EXPECT_DOUBLE_EQ(t["predicted_per_token_ms"].get<double>(), 20.0) << "over the 2 tokens after the first";
  EXPECT_DOUBLE_EQ(t["predicted_per_second"].get<double>(), 50.0);

  ChoiceResult c;
  c.finish = FinishReason::Stop;
  c.metrics = m;
  c.tool_calls = {{"call_a", "get_weather", "{\"city\":\"Paris\"}"}};
  const json full = completion_response(meta, {c}, Usage{12, 3, 4}, false, tok);
  EXPECT_EQ(full["system_fingerprint"], fp);
  EXPECT_EQ(full["timings"], t);
  EXPECT_EQ(full["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(full["choices"][0]["message"]["content"].is_null()) << "no text beside the calls";
  EXPECT_EQ(full["choices"][0]["message"]["tool_calls"][0],
            json({{"id", "call_a"}, {"type", "function"},
                  {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}));
  c.text = "Let me look.";
  EXPECT_EQ(completion_response(meta, {c}, Usage{}, false, tok)["choices"][0]["message"]["content"], "Let me look.");

  const json start = tool_call_start_chunk(meta, 0, 1, "call_b", "get_time", false);
  EXPECT_EQ(start["system_fingerprint"], fp);
  EXPECT_EQ(start["choices"][0]["delta"]["tool_calls"][0],
            json({{"index", 1}, {"id", "call_b"}, {"type", "function"}, {"function", {{"name", "get_time"}, {"arguments", ""}}}}));
  const json frag = tool_call_arguments_chunk(meta, 0, 1, "{\"zone\"", true);
  EXPECT_EQ(frag["choices"][0]["delta"]["tool_calls"][0], json({{"index", 1}, {"function", {{"arguments", "{\"zone\""}}}}));
  EXPECT_TRUE(frag["usage"].is_null());
  const json fin = finish_chunk(meta, 0, FinishReason::Stop, false, &m, true);
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(fin["timings"], t);
  meta.timings = false;
  EXPECT_FALSE(finish_chunk(meta, 0, FinishReason::Stop, false, &m)["choices"][0].contains("timings"));
  EXPECT_FALSE(finish_chunk(meta, 0, FinishReason::Stop, false, &m).contains("timings"));
  meta.system_fingerprint.clear();
  EXPECT_FALSE(finish_chunk(meta, 0, FinishReason::Stop, false).contains("system_fingerprint"));
}

TEST(Format, ErrorObjects) {
  const json e = error_json("bad", "invalid_request_error", "n");
  EXPECT_EQ(e, json({{"error", {{"message", "bad"}, {"type", "invalid_request_error"}, {"param", "n"}, {"code", nullptr}}}}));
}
