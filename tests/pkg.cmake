# libkeel.so and make install: the export list against keel.h (cmake -P) and
# an install into a temp prefix with a program built through pkg-config
# (tests/pkg/). Not in fuzz builds (no shared library is needed there).
if(NOT KEEL_FUZZ)
  find_program(KEEL_NM NAMES nm REQUIRED)
  add_test(NAME pkg_exports
    COMMAND ${CMAKE_COMMAND} -DLIB=$<TARGET_FILE:libkeel_shared>
      -DHEADER=${PROJECT_SOURCE_DIR}/include/keel.h -DNM=${KEEL_NM}
      -P ${PROJECT_SOURCE_DIR}/tests/pkg/exports.cmake)
  # an instrumented library needs an instrumented program
  set(KEEL_PKG_CFLAGS "")
  if(KEEL_SANITIZE)
    set(KEEL_PKG_CFLAGS -fsanitize=address,undefined -fno-sanitize-recover=all)
  endif()
  add_test(NAME pkg_install
    COMMAND sh ${PROJECT_SOURCE_DIR}/tests/pkg/install_test.sh ${PROJECT_SOURCE_DIR} ${CMAKE_BINARY_DIR}
      ${CMAKE_C_COMPILER} ${KEEL_PKG_CFLAGS})
  # make install builds first: alone, so that no test runs a binary it relinks
  set_tests_properties(pkg_install PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
endif()
