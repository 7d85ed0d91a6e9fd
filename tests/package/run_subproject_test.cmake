# The package_subproject_<way> tests: configure, build and run tests/package/subproject with olmax
# brought in by WAY (add_subdirectory or fetchcontent) from SOURCE_DIR.
# Usage: cmake -DWAY=... -DSOURCE_DIR=... -DWORK_DIR=... -DGENERATOR=... -DCXX_COMPILER=... -P run_subproject_test.cmake
function(run_step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${what}:\n${out}${err}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "package_subproject_${WAY}: ${what} failed (${result})")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
run_step("configure with olmax through ${WAY}"
  "${CMAKE_COMMAND}" -S "${CMAKE_CURRENT_LIST_DIR}/subproject" -B "${WORK_DIR}" -G "${GENERATOR}" -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DOLMAX_WAY=${WAY} -DOLMAX_SOURCE_DIR=${SOURCE_DIR})
run_step("build the app" "${CMAKE_COMMAND}" --build "${WORK_DIR}" --target app)
run_step("run the app" "${WORK_DIR}/app")
