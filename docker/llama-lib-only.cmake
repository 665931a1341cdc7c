# Passed to the llama-cpp-python build as -DCMAKE_PROJECT_INCLUDE=<this file> (docker/llama-wheel.sh, the
# Dockerfile's wheels stage): included after every project() call, it sets a normal variable that shadows the cache
# entry llama-cpp-python FORCEs ON (policy CMP0126), so llama.cpp's `common` library and the cpp-httplib it pulls in
# are not compiled. The Python package loads only libllama and libggml*: about 40% less to compile, and no unused
# libllama-common.so in the wheel.
set(LLAMA_BUILD_COMMON OFF)
