#include "tools/recipe/tokenized_corpus.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/files.h"
#include "testing/status_matchers.h"
#include "tools/recipe/tokenizer_info.h"

ABSL_FLAG(std::string, spm_train, "", "Path of @sentencepiece//:spm_train.");
ABSL_FLAG(std::string, spm_encode, "", "Path of @sentencepiece//:spm_encode.");

namespace keel::tools::recipe {
namespace {

using ::absl::StatusCode;
using ::keel::testing::NewTempDir;
using ::keel::testing::ReadFileOrFail;
using ::keel::testing::StatusIs;
using ::keel::testing::WriteFileOrFail;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

void Run(const std::string& command) { ASSERT_EQ(std::system(command.c_str()), 0) << command; }

// The .model spm_train (Debian's sentencepiece) learns from `text` with `flags`.
std::string TrainModel(const std::string& text, const std::string& flags) {
  const std::string dir = NewTempDir("spm");
  WriteFileOrFail(dir + "/train.txt", text);
  Run(absl::StrCat(absl::GetFlag(FLAGS_spm_train), " --input=", dir, "/train.txt --model_prefix=",
                   dir, "/m ", flags, " --minloglevel=2 >/dev/null 2>&1"));
  return dir + "/m.model";
}

// A unigram model of a few hundred pieces learnt from varied English and accented text, once.
const std::string& Model() {
  static const std::string* const model = [] {
    std::string text;
    for (int i = 0; i < 400; ++i) {
      absl::StrAppend(&text, "Line ", i, ": the quick brown fox jumps over ", i % 7,
                      " lazy dogs; café naïve résumé — déjà vu.\n");
    }
    return new std::string(TrainModel(text, "--vocab_size=200 --hard_vocab_limit=false"));
  }();
  return *model;
}

// spm_encode's ids for each line of `file`.
std::vector<std::vector<int64_t>> SpmEncode(const std::string& file,
                                            const std::string& model = Model()) {
  const std::string out = file + ".ids";
  Run(absl::StrCat(absl::GetFlag(FLAGS_spm_encode), " --model=", model, " --output_format=id < ",
                   file, " > ", out));
  std::vector<std::vector<int64_t>> lines;
  for (absl::string_view line : absl::StrSplit(ReadFileOrFail(out), '\n')) {
    std::vector<int64_t> ids;
    for (absl::string_view id : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      int64_t value;
      EXPECT_TRUE(absl::SimpleAtoi(id, &value)) << id;
      ids.push_back(value);
    }
    lines.push_back(ids);
  }
  lines.pop_back();  // after the last newline
  return lines;
}

// Each document's sequences of the dataset at `prefix`, whose tokens are `dtype` (uint16 or
// int32), decoded here from Megatron's format (the reader that would do it links LibTorch,
// whose protobuf clashes with the one libsentencepiece embeds): the .idx is "MMIDIDX\0\0",
// version (u64), dtype code (u8: 8 uint16, 4 int32), sequence count N (u64), document count D
// (u64), N int32 lengths, N int64 byte pointers and D int64 document indices; the .bin holds
// the tokens.
std::vector<std::vector<std::vector<int64_t>>> Documents(
    const std::string& prefix, sampling::TokenDtype dtype = sampling::TokenDtype::kUint16) {
  const std::string idx = ReadFileOrFail(prefix + ".idx");
  const std::string bin = ReadFileOrFail(prefix + ".bin");
  auto read = [](const std::string& bytes, size_t offset, auto value) {
    std::memcpy(&value, bytes.data() + offset, sizeof(value));
    return value;
  };
  const bool uint16 = dtype == sampling::TokenDtype::kUint16;
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(read(idx, 17, uint8_t{}), uint16 ? 8 : 4);
  const uint64_t n = read(idx, 18, uint64_t{});
  const uint64_t d = read(idx, 26, uint64_t{});
  EXPECT_EQ(idx.size(), 34 + 12 * n + 8 * d);
  std::vector<std::vector<std::vector<int64_t>>> documents;
  for (uint64_t j = 0; j + 1 < d; ++j) {
    documents.emplace_back();
    const int64_t first = read(idx, 34 + 12 * n + 8 * j, int64_t{});
    const int64_t last = read(idx, 34 + 12 * n + 8 * (j + 1), int64_t{});
    for (int64_t i = first; i < last; ++i) {
      const int32_t length = read(idx, 34 + 4 * i, int32_t{});
      const int64_t pointer = read(idx, 34 + 4 * n + 8 * i, int64_t{});
      std::vector<int64_t> tokens;
      for (int32_t t = 0; t < length; ++t) {
        tokens.push_back(uint16 ? read(bin, pointer + 2 * t, uint16_t{})
                                : read(bin, pointer + 4 * t, int32_t{}));
      }
      documents.back().push_back(tokens);
    }
  }
  return documents;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Every case learns its model with spm_train, and most check ids against spm_encode's
// (Debian's sentencepiece): without them there is nothing to compare with.
class TokenizedCorpusTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const std::string& tool :
         {absl::GetFlag(FLAGS_spm_train), absl::GetFlag(FLAGS_spm_encode)}) {
      if (std::optional<std::string> why = keel::testing::WhyNotExecutable(tool)) {
        GTEST_SKIP() << *why;
      }
    }
  }
};

TEST_F(TokenizedCorpusTest, TextFilesGetSpmEncodesIdsALineASequence) {
  const std::string dir = NewTempDir("text");
  WriteFileOrFail(dir + "/a.txt", "The quick fox.\n\nCafé déjà vu, 42 dogs!\n");
  WriteFileOrFail(dir + "/b.txt", "unseen wörds: ÆØÅ 漢字\nlast line without newline");
  TokenizeOptions options;
  options.tokenizer_model = Model();
  KEEL_ASSERT_OK_AND_ASSIGN(
      TokenizedCorpus corpus,
      BuildTokenizedCorpus({dir + "/a.txt", dir + "/b.txt"}, dir + "/out/corpus", options));
  const auto documents = Documents(dir + "/out/corpus");
  ASSERT_EQ(documents.size(), 2u);
  for (int d = 0; d < 2; ++d) {
    std::vector<std::vector<int64_t>> expected;
    for (const auto& line : SpmEncode(dir + (d == 0 ? "/a.txt" : "/b.txt"))) {
      if (!line.empty()) expected.push_back(line);  // a blank line adds no sequence
    }
    EXPECT_EQ(documents[d], expected) << "document " << d;
  }
  EXPECT_EQ(corpus.dtype, sampling::TokenDtype::kUint16);
  ASSERT_EQ(corpus.datasets.size(), 1u);
  EXPECT_EQ(corpus.datasets[0].documents, 2);
  EXPECT_EQ(corpus.datasets[0].sequences, 4);
  // The vocabulary as spm_train listed it, one piece a line.
  const std::string vocab = ReadFileOrFail(Model().substr(0, Model().size() - 6) + ".vocab");
  KEEL_ASSERT_OK_AND_ASSIGN(std::optional<TokenizerInfo> info,
                            ReadTokenizerInfo(dir + "/out/corpus"));
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->vocab_size, std::count(vocab.begin(), vocab.end(), '\n'));
  EXPECT_EQ(info->eos_id, 2);  // spm_train's default
  EXPECT_EQ(info->tokenizer_type, TokenizerType::kSentencePiece);
  EXPECT_TRUE(std::filesystem::path(info->tokenizer_model).is_absolute());
  EXPECT_EQ(Entries(dir + "/out"),
            (std::vector<std::string>{"corpus.bin", "corpus.idx", "corpus.tokenizer.json"}));
}

TEST_F(TokenizedCorpusTest, JsonlKeysMakeOneDatasetEachWithEodAppended) {
  const std::string dir = NewTempDir("jsonl");
  WriteFileOrFail(dir + "/docs.jsonl",
                  "{\"text\": \"The quick fox jumps.\", \"title\": \"Fox\"}\n"
                  "\n"
                  "{\"title\": \"Lists\", \"text\": [\"First sentence.\", \"Second one.\"]}\n"
                  "{\"text\": \"\", \"title\": \"Empty text\"}\n");
  WriteFileOrFail(dir + "/texts.txt",
                  "The quick fox jumps.\nFirst sentence.\nSecond one.\nFox\nLists\nEmpty text\n");
  const std::vector<std::vector<int64_t>> ids = SpmEncode(dir + "/texts.txt");
  auto with_eod = [](std::vector<int64_t> sequence) {
    sequence.push_back(2);
    return sequence;
  };
  TokenizeOptions options;
  options.tokenizer_model = Model();
  options.json_keys = {"text", "title"};
  options.append_eod = true;
  KEEL_ASSERT_OK_AND_ASSIGN(TokenizedCorpus corpus,
                            BuildTokenizedCorpus({dir + "/docs.jsonl"}, dir + "/web", options));
  ASSERT_EQ(corpus.datasets.size(), 2u);
  EXPECT_EQ(corpus.datasets[0].prefix, dir + "/web_text_document");
  const auto text = Documents(dir + "/web_text_document");
  ASSERT_EQ(text.size(), 3u);  // the blank line is not a document
  EXPECT_THAT(text[0], ElementsAre(with_eod(ids[0])));
  EXPECT_THAT(text[1], ElementsAre(ids[1], with_eod(ids[2])));  // EOD ends the last sentence
  EXPECT_THAT(text[2], IsEmpty());                              // no ids, so no EOD
  const auto title = Documents(dir + "/web_title_document");
  ASSERT_EQ(title.size(), 3u);
  EXPECT_THAT(title[2], ElementsAre(with_eod(ids[5])));
}

// A text file is read a batch of 16384 lines at a time: one longer than that is still one
// document, and the EOD still ends its last sequence when the next batch holds only blank lines.
TEST_F(TokenizedCorpusTest, ATextFileLongerThanABatchIsOneDocument) {
  const std::string dir = NewTempDir("long");
  std::string text;
  for (int i = 0; i < 16384; ++i) absl::StrAppend(&text, "Line ", i, " of a long fox.\n");
  WriteFileOrFail(dir + "/long.txt", text + "\n \n\n");
  WriteFileOrFail(dir + "/short.txt", "A short dog.\n");
  TokenizeOptions options;
  options.tokenizer_model = Model();
  options.append_eod = true;
  KEEL_ASSERT_OK_AND_ASSIGN(
      TokenizedCorpus corpus,
      BuildTokenizedCorpus({dir + "/long.txt", dir + "/short.txt"}, dir + "/out", options));
  std::vector<std::vector<int64_t>> long_ids = SpmEncode(dir + "/long.txt");
  ASSERT_EQ(long_ids.size(), 16387u);
  for (int blank = 0; blank < 3; ++blank) {
    ASSERT_THAT(long_ids.back(), IsEmpty());
    long_ids.pop_back();
  }
  long_ids.back().push_back(2);
  std::vector<std::vector<int64_t>> short_ids = SpmEncode(dir + "/short.txt");
  short_ids.back().push_back(2);
  EXPECT_THAT(Documents(dir + "/out"), ElementsAre(long_ids, short_ids));
  EXPECT_EQ(corpus.datasets[0].sequences, 16385);
}

TEST_F(TokenizedCorpusTest, TheSameBytesOnOneThreadOrTwo) {
  const std::string dir = NewTempDir("threads");
  std::string jsonl;
  for (int i = 0; i < 5000; ++i) {
    absl::StrAppend(&jsonl, "{\"text\": \"document ", i, " about ", i % 13, " foxes\"}\n");
  }
  WriteFileOrFail(dir + "/docs.jsonl", jsonl);
  TokenizeOptions options;
  options.tokenizer_model = Model();
  options.json_keys = {"text"};
  for (int threads : {1, 2}) {
    options.threads = threads;
    KEEL_ASSERT_OK(
        BuildTokenizedCorpus({dir + "/docs.jsonl"}, absl::StrCat(dir + "/t", threads), options)
            .status());
  }
  EXPECT_EQ(ReadFileOrFail(dir + "/t1_text_document.bin"),
            ReadFileOrFail(dir + "/t2_text_document.bin"));
  EXPECT_EQ(ReadFileOrFail(dir + "/t1_text_document.idx"),
            ReadFileOrFail(dir + "/t2_text_document.idx"));
}

// DType.optimal_dtype: a vocabulary of 65500 pieces or more takes int32 tokens. A word model
// learns one piece per distinct word, so 70000 distinct words give it 66000 pieces.
TEST_F(TokenizedCorpusTest, AVocabularyOf65500PiecesOrMoreTakesInt32Tokens) {
  std::string words;
  for (int i = 0; i < 70000; ++i) absl::StrAppend(&words, "w", i, i % 10 == 9 ? "\n" : " ");
  const std::string model = TrainModel(words, "--model_type=word --vocab_size=66000");
  const std::string dir = NewTempDir("int32");
  WriteFileOrFail(dir + "/a.txt", "w1 w65535 w69999\nw3 unseen w40000\n");
  TokenizeOptions options;
  options.tokenizer_model = model;
  options.append_eod = true;
  KEEL_ASSERT_OK_AND_ASSIGN(TokenizedCorpus corpus,
                            BuildTokenizedCorpus({dir + "/a.txt"}, dir + "/big", options));
  EXPECT_EQ(corpus.dtype, sampling::TokenDtype::kInt32);
  EXPECT_EQ(corpus.info.vocab_size, 66000);
  std::vector<std::vector<int64_t>> expected = SpmEncode(dir + "/a.txt", model);
  ASSERT_EQ(expected.size(), 2u);
  expected[1].push_back(2);  // spm_train's EOS id ends the document
  EXPECT_THAT(Documents(dir + "/big", sampling::TokenDtype::kInt32), ElementsAre(expected));
}

// Every bad input is an error naming the file (and line), and leaves nothing under the prefix.
TEST_F(TokenizedCorpusTest, BadInputIsNamedAndLeavesNothingBehind) {
  const std::string dir = NewTempDir("bad");
  WriteFileOrFail(dir + "/good.jsonl", "{\"text\": \"fine\"}\n");
  WriteFileOrFail(dir + "/not_json.jsonl", "{\"text\": \"fine\"}\n{\"text\": oops}\n");
  WriteFileOrFail(dir + "/no_key.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"body\": 1}\n");
  WriteFileOrFail(dir + "/number.jsonl", "{\"text\": 7}\n");
  WriteFileOrFail(dir + "/array.jsonl", "[\"text\"]\n");
  // Python's json reads 1e400 as inf; nlohmann's exception for it once ended the process.
  WriteFileOrFail(dir + "/overflow.jsonl", "{\"text\": \"a\", \"score\": 1e400}\n");
  WriteFileOrFail(dir + "/latin1.txt", "fine\ncaf\xe9\n");
  const std::string no_eos = TrainModel("fine words\nmore words\n",
                                        "--vocab_size=20 --hard_vocab_limit=false --eos_id=-1");
  const struct {
    std::vector<std::string> inputs;
    std::vector<std::string> keys;
    std::string model;
    std::string message;
    StatusCode code = StatusCode::kInvalidArgument;
    bool append_eod = false;
    int threads = 0;
  } cases[] = {
      {{"good.jsonl", "not_json.jsonl"}, {"text"}, Model(), "not_json.jsonl:2: invalid JSON"},
      {{"array.jsonl"}, {"text"}, Model(), "array.jsonl:1: not a JSON object"},
      {{"overflow.jsonl"},
       {"text"},
       Model(),
       "overflow.jsonl:1: invalid JSON: [json.exception.out_of_range.406] number overflow parsing "
       "'1e400'"},
      {{"no_key.jsonl"}, {"text"}, Model(), "no_key.jsonl:3: no key \"text\""},
      {{"number.jsonl"},
       {"text"},
       Model(),
       "number.jsonl:1: \"text\" is neither a string nor a list of strings"},
      {{"latin1.txt"}, {}, Model(), "latin1.txt:2: invalid UTF-8 at byte 4 of the line"},
      {{"good.jsonl"}, {"text"}, dir + "/good.jsonl", "good.jsonl: not a SentencePiece model"},
      {{"absent.txt"}, {}, Model(), "absent.txt: no such input file", StatusCode::kNotFound},
      {{}, {}, Model(), "no input file given"},
      {{"good.jsonl"}, {"text", ""}, Model(), "--json_keys holds an empty key"},
      // The second "text" once failed renaming files the first had renamed already.
      {{"good.jsonl"},
       {"text", "title", "text"},
       Model(),
       "--json_keys lists \"text\" twice; allowed: each key once"},
      {{"good.jsonl"},
       {"text"},
       no_eos,
       "--append_eod: the SentencePiece model " + no_eos + " has no EOS piece (eos_id -1)",
       StatusCode::kInvalidArgument,
       /*append_eod=*/true},
      {{"good.jsonl"},
       {"text"},
       Model(),
       "--workers (-1) must be in [0, 1024] (0: one per core)",
       StatusCode::kInvalidArgument,
       false,
       /*threads=*/-1},
      {{"good.jsonl"},
       {"text"},
       Model(),
       "--workers (100000) must be in [0, 1024]",
       StatusCode::kInvalidArgument,
       false,
       /*threads=*/100000},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.message);
    TokenizeOptions options;
    options.tokenizer_model = c.model;
    options.json_keys = c.keys;
    options.append_eod = c.append_eod;
    options.threads = c.threads;
    std::vector<std::string> inputs;
    for (const std::string& input : c.inputs) inputs.push_back(dir + "/" + input);
    std::filesystem::create_directories(dir + "/out");
    EXPECT_THAT(BuildTokenizedCorpus(inputs, dir + "/out/data", options).status(),
                StatusIs(c.code, HasSubstr(c.message)));
    EXPECT_THAT(Entries(dir + "/out"), IsEmpty());
  }
}

}  // namespace
}  // namespace keel::tools::recipe
