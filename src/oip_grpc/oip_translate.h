// Between the OIP's gRPC messages and the REST requests and answers they stand for
// (oip_grpc.h). Pure functions, any thread; private to the grpc module and its tests.
#pragma once

#include <string>

#include <grpcpp/support/status.h>

#include "common/common.h"
#include "grpc_predict_v2.pb.h"
#include "http/http.h"

namespace flotilla::oip_grpc {

// The REST request of a ModelInfer call: POST /v2/models/{name}[/versions/{v}]/infer with the
// OIP JSON body (id, parameters, inputs with `data`, requested outputs). Inputs come from
// raw_input_contents (all inputs, in order) or from each input's typed contents; FP16 and
// BF16 only raw. Errors (kInvalidArgument, naming the input): no model name or one that is
// not a path segment, a datatype the protocol does not have, contents of the wrong type or
// count for the shape, raw contents for some inputs only, a non-finite float (JSON has no
// form for it), BYTES that are not UTF-8 (JSON strings carry text only).
Result<http::Request> rest_infer_request(const inference::ModelInferRequest& request);

// A REST GET for the other calls: `path` ("/ready", "" for metadata) under
// /v2/models/{name}[/versions/{version}]. Errors as above for the name.
Result<http::Request> rest_model_request(const std::string& name, const std::string& version,
                                         std::string_view path);
// A REST GET of a fixed path (/v2/health/live, /v2/health/ready, /v2).
http::Request rest_get(std::string path);

// Reads a 200 answer's JSON into the response: each output's data as raw_output_contents
// (what tritonclient reads), little-endian, BYTES length-prefixed. Errors (kInternal: the
// model server's answer is at fault): not JSON, a field of the wrong type, data that does not
// fit the datatype or the shape.
Status decode_infer_answer(std::string& body, inference::ModelInferResponse& out);
Status decode_model_metadata_answer(std::string& body, inference::ModelMetadataResponse& out);
Status decode_server_metadata_answer(std::string& body, inference::ServerMetadataResponse& out);

// The gRPC code for an HTTP status (google.rpc.Code's mapping: 400 INVALID_ARGUMENT, 401
// UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 413 and 429 RESOURCE_EXHAUSTED, 501
// and 405 UNIMPLEMENTED, 502 and 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, ...).
grpc::StatusCode grpc_code_for_http(int status);
// A non-2xx answer as a gRPC status: its code by grpc_code_for_http, its message the error
// body's ({"error": "..."}, {"error": {"message": ...}}, {"message": ...}) or, failing that,
// the body's first 256 bytes.
grpc::Status status_of_answer(const http::Response& answer);
// A Status of ours (kInvalidArgument, ...) as a gRPC status with the same message.
grpc::Status to_grpc_status(const Status& status);

}  // namespace flotilla::oip_grpc
