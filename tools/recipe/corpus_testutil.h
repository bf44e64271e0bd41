// A small byte corpus for the trainer's tests: 200 lines of a pangram (about ten thousand
// byte tokens) as a Megatron indexed dataset, built once per process in a temporary directory.
//
//   options.data.prefix = PangramCorpus();
#ifndef KEEL_TOOLS_RECIPE_CORPUS_TESTUTIL_H_
#define KEEL_TOOLS_RECIPE_CORPUS_TESTUTIL_H_

#include <string>

namespace keel::tools::recipe {

// The dataset's path prefix (`.bin` and `.idx` beside it). A failure to build it fails the
// test that asked.
const std::string& PangramCorpus();

}  // namespace keel::tools::recipe

#endif  // KEEL_TOOLS_RECIPE_CORPUS_TESTUTIL_H_
