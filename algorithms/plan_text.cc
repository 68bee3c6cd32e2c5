// Plan files (plan_text.h).
#include "algorithms/plan_text.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>

namespace loom {
namespace {

constexpr int kFormatVersion = 1;

const Action kActions[] = {
    Action::kSend,         Action::kRecv, Action::kRecvReduce, Action::kRecvReduceSend, Action::kRecvReduceCopySend,
    Action::kRecvCopySend, Action::kCopy, Action::kReduce};

bool sameName(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// Which regions a step of `action` has.
bool hasSrc(Action a) { return a != Action::kRecv && a != Action::kRecvCopySend; }
bool hasSrc2(Action a) { return a == Action::kReduce; }
bool hasDst(Action a) { return a != Action::kSend && a != Action::kRecvReduceSend; }

// Reads one file, line by line; every failure is a message naming the line.
class Reader {
 public:
  Reader(std::string_view text, std::string* error) : text_(text), error_(error) {}

  bool read(PlanFile* file) {
    if (!nextLine() || !word("loom-plan")) return fail("the file does not start with \"loom-plan 1\"");
    int version = 0;
    if (!integer(&version, 0, 1 << 20)) return false;
    if (version != kFormatVersion) return fail("format version " + std::to_string(version) + "; this build reads 1");
    if (!endOfLine() || !nextLine() || !word("call")) return fail("expected the \"call\" line");
    PlanFile result;
    if (!callLine(&result)) return false;
    size_t steps = 0;
    for (int rank = 0; rank < result.nranks; ++rank) {
      if (!nextLine() || !word("rank")) return fail("expected the line of rank " + std::to_string(rank));
      int number = 0;
      if (!integer(&number, 0, result.nranks - 1)) return false;
      if (number != rank)
        return fail("rank " + std::to_string(number) + " where rank " + std::to_string(rank) + " is due");
      RankPlan plan;
      if (!rankLine(result, rank, &plan)) return false;
      // Lanes, steps and phases up to the next rank line.
      while (nextLine()) {
        if (peekWord("rank")) {
          pushBack();
          break;
        }
        if (word("lane")) {
          if (!word("channel")) return fail("expected \"lane channel C\"");
          Lane lane;
          if (!integer(&lane.channel, 0, kChannelSets * result.nChannels - 1) || !endOfLine()) return false;
          if (++steps > kPlanFileMaxSteps)
            return fail("more than " + std::to_string(kPlanFileMaxSteps) + " lanes and steps");
          plan.lanes.push_back(std::move(lane));
        } else if (word("phase")) {
          if (plan.lanes.empty()) return fail("a phase before any lane");
          if (!endOfLine()) return false;
          plan.lanes.back().startPhase();
        } else {
          if (plan.lanes.empty()) return fail("a step before any lane");
          if (++steps > kPlanFileMaxSteps)
            return fail("more than " + std::to_string(kPlanFileMaxSteps) + " lanes and steps");
          Step step;
          if (!stepLine(result.nranks, plan, &step)) return false;
          plan.lanes.back().steps.push_back(step);
        }
      }
      result.plans.push_back(std::move(plan));
    }
    if (nextLine()) return fail("text after the last rank's plan");
    *file = std::move(result);
    return true;
  }

 private:
  bool callLine(PlanFile* file) {
    std::string_view name = token();
    if (!parseCollectiveName(name, &file->collective)) return fail("unknown collective \"" + std::string(name) + "\"");
    if (file->collective == Collective::kAllToAllv || file->collective == Collective::kSendRecv)
      return fail(std::string(collectiveName(file->collective)) +
                  " has counts per rank; plan files hold collectives "
                  "whose arguments every rank shares");
    if (!word("ranks") || !integer(&file->nranks, 1, kPlanFileMaxRanks)) return fail("expected \"ranks N\"");
    if (!word("count") || !size(&file->count, kPlanFileMaxCount)) return fail("expected \"count N\"");
    if (!word("root") || !integer(&file->root, 0, file->nranks - 1)) return fail("expected \"root R\" below ranks");
    if (!word("channels") || !integer(&file->nChannels, 1, 64)) return fail("expected \"channels C\" (1 to 64)");
    if (!word("algorithm")) return fail("expected \"algorithm NAME\"");
    file->algorithm = std::string(token());
    if (file->algorithm.empty()) return fail("the algorithm has no name");
    for (char c : file->algorithm)
      if (c < 0x21 || c > 0x7e) return fail("the algorithm's name is not printable");
    return endOfLine();
  }

  bool rankLine(const PlanFile& file, int rank, RankPlan* plan) {
    const CollArgs args = file.argsFor(rank);
    if (!word("input") || !size(&plan->inputCount, inputCountOf(args)))
      return fail("expected \"input N\", at most the call's " + std::to_string(inputCountOf(args)) + " elements");
    if (!word("output") || !size(&plan->outputCount, outputCountOf(args)))
      return fail("expected \"output N\", at most the call's " + std::to_string(outputCountOf(args)) + " elements");
    if (!word("scratch") || !size(&plan->scratchCount, kPlanFileMaxCount)) return fail("expected \"scratch N\"");
    plan->wideScratch = word("wide");  // partials in fp32 for fp16 and bf16 (RankPlan::wideScratch)
    if (!word("reduced")) return fail("expected \"reduced out[OFFSET+COUNT]\"");
    if (!region(*plan, &plan->reducedOutput)) return false;
    if (plan->reducedOutput.buffer != Buffer::kOutput) return fail("the reduced region is not in the output");
    return endOfLine();
  }

  bool stepLine(int nranks, const RankPlan& plan, Step* step) {
    std::string_view name = token();
    bool known = false;
    for (Action action : kActions)
      if (sameName(name, actionName(action))) step->action = action, known = true;
    if (!known) return fail("unknown step \"" + std::string(name) + "\"");
    const Action a = step->action;
    bool from = false, to = false, src = false, src2 = false, dst = false;
    for (std::string_view field = token(); !field.empty(); field = token()) {
      bool* seen = nullptr;
      bool allowed = false;
      if (field == "from") {
        seen = &from, allowed = actionReceives(a);
        if (allowed && !integer(&step->recvPeer, 0, nranks - 1)) return false;
      } else if (field == "to") {
        seen = &to, allowed = actionSends(a);
        if (allowed && !integer(&step->sendPeer, 0, nranks - 1)) return false;
      } else if (field == "src") {
        seen = &src, allowed = hasSrc(a);
        if (allowed && !region(plan, &step->src)) return false;
      } else if (field == "src2") {
        seen = &src2, allowed = hasSrc2(a);
        if (allowed && !region(plan, &step->src2)) return false;
      } else if (field == "dst") {
        seen = &dst, allowed = hasDst(a);
        if (allowed && !region(plan, &step->dst)) return false;
      } else {
        return fail("unknown field \"" + std::string(field) + "\"");
      }
      if (!allowed) return fail(std::string(actionName(a)) + " has no \"" + std::string(field) + "\"");
      if (*seen) return fail("\"" + std::string(field) + "\" given twice");
      *seen = true;
    }
    if (from != actionReceives(a) || to != actionSends(a) || src != hasSrc(a) || src2 != hasSrc2(a) || dst != hasDst(a))
      return fail(std::string(actionName(a)) + " needs" + (actionReceives(a) ? " from" : "") +
                  (actionSends(a) ? " to" : "") + (hasSrc(a) ? " src" : "") + (hasSrc2(a) ? " src2" : "") +
                  (hasDst(a) ? " dst" : ""));
    const size_t count = step->count();
    if ((src && step->src.count != count) || (src2 && step->src2.count != count) || (dst && step->dst.count != count))
      return fail("the regions of a step differ in size");
    return true;
  }

  // BUFFER[OFFSET+COUNT], inside the rank's buffer of that kind.
  bool region(const RankPlan& plan, Region* out) {
    std::string_view text = token();
    const size_t open = text.find('['), plus = text.find('+');
    if (open == std::string_view::npos || plus == std::string_view::npos || plus < open || text.back() != ']')
      return fail("\"" + std::string(text) + "\" is not a region such as in[0+100]");
    const std::string_view buffer = text.substr(0, open);
    size_t limit = 0;
    if (buffer == "in") {
      out->buffer = Buffer::kInput, limit = plan.inputCount;
    } else if (buffer == "out") {
      out->buffer = Buffer::kOutput, limit = plan.outputCount;
    } else if (buffer == "scratch") {
      out->buffer = Buffer::kScratch, limit = plan.scratchCount;
    } else {
      return fail("unknown buffer \"" + std::string(buffer) + "\" (in, out or scratch)");
    }
    if (!number(text.substr(open + 1, plus - open - 1), &out->offset, limit) ||
        !number(text.substr(plus + 1, text.size() - plus - 2), &out->count, limit - out->offset))
      return fail("region " + std::string(text) + " does not lie inside the " + std::to_string(limit) +
                  " elements of its buffer");
    out->bufferIndex = 0;
    return true;
  }

  // ---- Lines and tokens ----

  // Moves to the next line that holds anything but blanks and a comment; false at the end of the text.
  bool nextLine() {
    at_ = 0;
    if (pushedBack_) {
      pushedBack_ = false;
      return true;
    }
    while (rest_ <= text_.size()) {
      size_t end = text_.find('\n', rest_);
      if (end == std::string_view::npos) end = text_.size();
      line_ = text_.substr(rest_, end - rest_);
      rest_ = end + 1;
      ++lineNumber_;
      line_ = line_.substr(0, std::min(line_.find('#'), line_.size()));
      if (!peek().empty()) return true;
    }
    atEnd_ = true;
    return false;
  }
  void pushBack() { pushedBack_ = true; }
  std::string_view peek() {
    size_t start = at_;
    while (start < line_.size() && (line_[start] == ' ' || line_[start] == '\t' || line_[start] == '\r')) ++start;
    size_t end = start;
    while (end < line_.size() && line_[end] != ' ' && line_[end] != '\t' && line_[end] != '\r') ++end;
    return line_.substr(start, end - start);
  }
  std::string_view token() {
    std::string_view next = peek();
    at_ = static_cast<size_t>(next.data() - line_.data()) + next.size();
    return next;
  }
  bool peekWord(std::string_view expected) { return peek() == expected; }
  bool word(std::string_view expected) {
    if (peek() != expected) return false;
    token();
    return true;
  }
  bool endOfLine() {
    std::string_view extra = peek();
    return extra.empty() || fail("unexpected \"" + std::string(extra) + "\"");
  }
  static bool number(std::string_view text, size_t* value, size_t max) {
    if (text.empty()) return false;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
    return ec == std::errc() && end == text.data() + text.size() && *value <= max;
  }
  bool size(size_t* value, size_t max) {
    std::string_view text = token();
    return number(text, value, max) ||
           fail("\"" + std::string(text) + "\" is not a number from 0 to " + std::to_string(max));
  }
  bool integer(int* value, int min, int max) {
    std::string_view text = token();
    size_t parsed = 0;
    if (min < 0 || !number(text, &parsed, static_cast<size_t>(max)) || static_cast<int>(parsed) < min)
      return fail("\"" + std::string(text) + "\" is not a number from " + std::to_string(min) + " to " +
                  std::to_string(max));
    *value = static_cast<int>(parsed);
    return true;
  }
  bool fail(const std::string& what) {
    *error_ = (atEnd_ ? std::string("the end of the file") : "line " + std::to_string(lineNumber_)) + ": " + what;
    return false;
  }

  std::string_view text_;
  std::string* error_;
  std::string_view line_;
  size_t rest_ = 0, at_ = 0;
  int lineNumber_ = 0;
  bool pushedBack_ = false, atEnd_ = false;
};

}  // namespace

CollArgs PlanFile::argsFor(int rank) const {
  CollArgs args{};
  args.collective = collective;
  args.nranks = nranks;
  args.rank = rank;
  args.root = root;
  args.count = count;
  args.nChannels = nChannels;
  return args;
}

std::string formatPlanFile(const PlanFile& file) {
  std::string text = "loom-plan " + std::to_string(kFormatVersion) + "\n";
  text += std::string("call ") + collectiveName(file.collective) + " ranks " + std::to_string(file.nranks) + " count " +
          std::to_string(file.count) + " root " + std::to_string(file.root) + " channels " +
          std::to_string(file.nChannels) + " algorithm " + file.algorithm + "\n";
  for (size_t r = 0; r < file.plans.size(); ++r) {
    const RankPlan& plan = file.plans[r];
    text += "rank " + std::to_string(r) + " input " + std::to_string(plan.inputCount) + " output " +
            std::to_string(plan.outputCount) + " scratch " + std::to_string(plan.scratchCount) +
            (plan.wideScratch ? " wide" : "") + " reduced " +
            describeRegion(plan.reducedOutput) + "\n";
    for (const Lane& lane : plan.lanes) {
      text += "lane channel " + std::to_string(lane.channel) + "\n";
      for (size_t s = 0; s < lane.steps.size(); ++s) {
        for (size_t p = 1; p < lane.phaseCount(); ++p)
          if (lane.phaseBegin(p) == s) text += "phase\n";
        text += describeStep(lane.steps[s]) + "\n";
      }
    }
  }
  return text;
}

bool parsePlanFile(std::string_view text, PlanFile* file, std::string* error) { return Reader(text, error).read(file); }

}  // namespace loom
