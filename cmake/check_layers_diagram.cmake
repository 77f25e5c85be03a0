# docs/design.md's "Layers" diagram (between <!-- layers:begin --> and
# <!-- layers:end -->) must be what tools/check_layers.sh --diagram prints.
#   cmake -DROOT=<source dir> -P cmake/check_layers_diagram.cmake
execute_process(COMMAND bash ${ROOT}/tools/check_layers.sh --diagram
  OUTPUT_VARIABLE want RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tools/check_layers.sh --diagram failed (${rc})")
endif()
file(READ ${ROOT}/docs/design.md doc)
string(FIND "${doc}" "<!-- layers:begin -->\n```\n" b)
string(FIND "${doc}" "```\n<!-- layers:end -->" e)
if(b LESS 0 OR e LESS 0)
  message(FATAL_ERROR "docs/design.md: no <!-- layers:begin --> ``` ... ``` <!-- layers:end --> block")
endif()
string(LENGTH "<!-- layers:begin -->\n```\n" l)
math(EXPR b "${b} + ${l}")
math(EXPR n "${e} - ${b}")
string(SUBSTRING "${doc}" ${b} ${n} have)
if(NOT have STREQUAL want)
  message(FATAL_ERROR "docs/design.md's layer diagram differs from "
    "tools/check_layers.sh --diagram; paste its output there.\nscript:\n${want}\ndoc:\n${have}")
endif()
message(STATUS "docs/design.md's layer diagram is the script's")
