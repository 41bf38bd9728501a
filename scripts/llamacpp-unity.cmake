# Given to llama.cpp's CMake by scripts/install-llamacpp.sh (CMAKE_PROJECT_INCLUDE) with
# CMAKE_UNITY_BUILD=ON. A unity build compiles each target's sources in batches, so the headers
# every file includes (nlohmann/json, httplib, the STL) are parsed once per batch instead of once
# per file: 626 CPU-seconds -> about 370 for llama-server on the 2-core box, same -O3 code.
# These sources do not compile inside a batch, and are compiled alone:
#   common/json.cpp         specialises common_json::get<T>() after a batch-mate instantiated it
#   tools/mtmd/mtmd-helper* refuse (#error) to see mtmd's internal headers that batch-mates include
#   ggml-cpu/amx/*          built where the CPU has AMX (GGML_NATIVE): they declare ggml's quant
#                           blocks with other member names than their batch-mates ("block_q4_1
#                           has no member named d", seen on a Xeon with amx_tile)
# Deferred to the end of the top-level CMakeLists: the directories must exist by then.
include_guard(GLOBAL)
function(_ceiling_unity_exclusions)
  set_source_files_properties(common/json.cpp DIRECTORY common
    PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  set_source_files_properties(tools/mtmd/mtmd-helper.cpp tools/mtmd/mtmd-helper-gen.cpp
    DIRECTORY tools/mtmd PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  set_source_files_properties(ggml/src/ggml-cpu/amx/amx.cpp ggml/src/ggml-cpu/amx/mmq.cpp
    DIRECTORY ggml/src PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _ceiling_unity_exclusions)
