# Memory core: the differential driver binary and its ctest runs.
add_executable(fuzz_memory ${PROJECT_SOURCE_DIR}/tests/fuzz_memory.c)
target_compile_options(fuzz_memory PRIVATE ${KEEL_WARN})
target_link_libraries(fuzz_memory PRIVATE keel_testsupport)

# make test: >= 200,000 operations across seeds and configurations (preset
# 8 and seeds 22, 104, 152: indexer columns, sparse attention).
# Under ASan (KEEL_SANITIZE) the same seeds run with fewer operations.
if(KEEL_SANITIZE)
  set(KEEL_MEMFUZZ_OPS 8000)
else()
  set(KEEL_MEMFUZZ_OPS 25000)
endif()
foreach(cfg RANGE 0 8)
  add_test(NAME fuzz_memory_preset${cfg}
    COMMAND fuzz_memory --seed ${cfg}1 --ops ${KEEL_MEMFUZZ_OPS} --config ${cfg})
endforeach()
foreach(seed 11 22 33 44 55 66 77 88 104 152)
  add_test(NAME fuzz_memory_seed${seed} COMMAND fuzz_memory --seed ${seed} --ops ${KEEL_MEMFUZZ_OPS})
endforeach()
# The AVX2 attention kernels on machines whose best path is AVX-512 (a level
# the CPU lacks is clamped to its best, so these run anywhere).
foreach(seed 12 23)
  add_test(NAME fuzz_memory_avx2_seed${seed} COMMAND fuzz_memory --seed ${seed} --ops ${KEEL_MEMFUZZ_OPS})
  set_tests_properties(fuzz_memory_avx2_seed${seed} PROPERTIES ENVIRONMENT "KEEL_SIMD=avx2")
endforeach()
