# The libFuzzer targets (tests/fuzz/), each seeded from tests/fuzz/seeds/<target>/. In make check
# each runs KEEL_FUZZ_SECONDS (default 20) under the "fuzz" label; `make fuzz` runs them longer.
set(KEEL_FUZZ_SECONDS 20 CACHE STRING "seconds each fuzz target runs under ctest")
enable_testing()
foreach(target safetensors config tokenizer trace trainer_state chat_template)
  add_executable(fuzz_${target} tests/fuzz/fuzz_${target}.c)
  target_include_directories(fuzz_${target} PRIVATE tests/fuzz src)
  target_link_libraries(fuzz_${target} PRIVATE keelcore)
  target_link_options(fuzz_${target} PRIVATE -fsanitize=fuzzer)
  add_test(NAME fuzz_${target} COMMAND ${CMAKE_SOURCE_DIR}/scripts/run-fuzzer.sh $<TARGET_FILE:fuzz_${target}>
           ${CMAKE_SOURCE_DIR}/tests/fuzz/seeds/${target} ${CMAKE_BINARY_DIR}/fuzz-work/${target} ${KEEL_FUZZ_SECONDS})
  set_tests_properties(fuzz_${target} PROPERTIES LABELS "fuzz")
endforeach()
