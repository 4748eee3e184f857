// Wire formats of the inference protocols: Open Inference Protocol v2 (KServe, Triton) and
// MLflow's scoring server. Pure functions: no I/O, no shared state; every function may be
// called from any thread. Decoders never throw: bad input becomes an kInvalidArgument Status
// whose message names the offending field. See docs/replica.md and ../shared/PROTOCOLS.md.
#pragma once

#include <string>
#include <string_view>

#include "common/common.h"

namespace flotilla::protocol {

// ---- Open Inference Protocol v2 ---------------------------------------------------------------

// Decodes an inference request body. `body` may be grown by a few bytes of padding that the
// JSON parser needs; its contents are unchanged.
Result<InferRequest> decode_oip_infer_request(std::string& body);

// Appends the JSON inference response to `out`.
void encode_oip_infer_response(const InferResponse& response, std::string& out);

std::string encode_oip_model_metadata(const ModelMetadata& metadata);
std::string encode_oip_error(std::string_view message);

// ---- MLflow scoring (/invocations) -----------------------------------------------------------

enum class MlflowFormat { kJson, kCsv };

// Checks the Content-Type of an /invocations request as MLflow does: application/json or
// text/csv, with at most a `charset=utf-8` parameter. Anything else is kUnimplemented (415).
Result<MlflowFormat> parse_mlflow_content_type(std::string_view content_type);

// Decodes a JSON body with exactly one of dataframe_split, dataframe_records, instances or
// inputs. Produces one input tensor named "input" (2-D, or 1-D for a single unnamed row), with
// column_names set when the body names its columns.
Result<InferRequest> decode_mlflow_json(std::string& body);
// Decodes a CSV body whose first line is a header.
Result<InferRequest> decode_mlflow_csv(std::string_view body);

// Appends `{"predictions": [...]}` for one output tensor (1-D → list, 2-D → list of rows).
void encode_mlflow_predictions(const Tensor& output, std::string& out);
// {"error_code": "BAD_REQUEST", "message": "..."} and the like.
std::string encode_mlflow_error(StatusCode code, std::string_view message);

// ---- helpers shared by encoders ----------------------------------------------------------------

// Appends `value` as a JSON string literal (quoted and escaped).
void append_json_string(std::string_view value, std::string& out);

}  // namespace flotilla::protocol
