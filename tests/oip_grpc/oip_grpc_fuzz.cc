// The OIP gRPC translation (src/oip_grpc/oip_translate.cc) both ways: a client's ModelInferRequest
// (protobuf bytes, as gRPC hands them over) into the REST request, and a model server's JSON
// answers into the responses. The first byte picks which; the rest is the input.
#include <cstddef>
#include <cstdint>
#include <string>

#include <simdjson.h>

#include "oip_grpc/oip_translate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) {
    return 0;
  }
  std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      inference::ModelInferRequest request;
      if (!request.ParseFromString(input)) {
        return 0;
      }
      auto rest = flotilla::oip_grpc::rest_infer_request(request);
      if (rest.is_ok()) {
        // What the translation writes is always JSON the REST path can parse.
        simdjson::dom::parser parser;
        simdjson::dom::element root;
        if (parser.parse(rest->body).get(root) != simdjson::SUCCESS) {
          __builtin_trap();
        }
      }
      break;
    }
    case 1: {
      inference::ModelInferResponse response;
      (void)flotilla::oip_grpc::decode_infer_answer(input, response);
      break;
    }
    case 2: {
      inference::ModelMetadataResponse response;
      (void)flotilla::oip_grpc::decode_model_metadata_answer(input, response);
      break;
    }
    default: {
      inference::ServerMetadataResponse response;
      (void)flotilla::oip_grpc::decode_server_metadata_answer(input, response);
      break;
    }
  }
  return 0;
}
