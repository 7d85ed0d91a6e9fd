# Builds TARGET in BUILD_DIR, then runs PROGRAM; fails when either fails (the compiler's or the
# program's output says where). Usage: cmake -DBUILD_DIR=... -DTARGET=... -DCONFIG=... -DPROGRAM=... -P build_and_run.cmake
# --parallel 2: one translation unit per markdown page, and CI has two cores.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET} --config ${CONFIG} --parallel 2 RESULT_VARIABLE built)
if(NOT built EQUAL 0)
  message(FATAL_ERROR "building ${TARGET} failed: a C++ block of the README or docs/ does not compile (the error names its file and line)")
endif()
execute_process(COMMAND ${PROGRAM} RESULT_VARIABLE ran)
if(NOT ran EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} failed: a runnable C++ block of the README or docs/ failed (see FAILED above)")
endif()
