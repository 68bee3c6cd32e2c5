// loom-train's text, metrics and plots (report.h).
#include "tools/train/report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace loom::train {

using namespace loom::parallel;

std::string humanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f %s", bytes, units[unit]);
  return text;
}

std::string fixed(double value, int decimals) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

std::string duration(double seconds) {
  char text[32];
  const long whole = std::lround(seconds);
  if (whole >= 3600)
    std::snprintf(text, sizeof(text), "%ldh%02ldm", whole / 3600, whole / 60 % 60);
  else
    std::snprintf(text, sizeof(text), "%ldm%02lds", whole / 60, whole % 60);
  return text;
}

namespace {

// Closes `file`, false (said on stderr) when anything written to it was lost.
bool closeWritten(FILE* file, const std::string& path) {
  const bool good = std::ferror(file) == 0;
  if (std::fclose(file) != 0 || !good) {
    std::fprintf(stderr, "loom-train: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  return true;
}

FILE* openForWriting(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) std::fprintf(stderr, "loom-train: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
  return file;
}

}  // namespace

bool writeText(const std::string& path, const std::string& text) {
  FILE* file = openForWriting(path);
  if (file == nullptr) return false;
  std::fputs(text.c_str(), file);
  return closeWritten(file, path);
}

bool writeMetrics(const std::string& path, const std::vector<Metric>& metrics) {
  FILE* file = openForWriting(path);
  if (file == nullptr) return false;
  const bool json = path.ends_with(".json");
  if (json)
    std::fprintf(file, "[\n");
  else
    std::fprintf(file, "step,loss,ms_per_step,tokens_per_s,val_loss\n");
  for (size_t i = 0; i < metrics.size(); ++i) {
    const Metric& m = metrics[i];
    char validation[32] = "";
    if (!std::isnan(m.validationLoss)) std::snprintf(validation, sizeof(validation), "%.9g", m.validationLoss);
    if (json)
      std::fprintf(file,
                   "  {\"step\": %d, \"loss\": %.9g, \"ms_per_step\": %.3f, \"tokens_per_s\": %.1f, "
                   "\"val_loss\": %s}%s\n",
                   m.step, m.loss, m.milliseconds, m.tokensPerSecond, validation[0] ? validation : "null",
                   i + 1 < metrics.size() ? "," : "");
    else
      std::fprintf(file, "%d,%.9g,%.3f,%.1f,%s\n", m.step, m.loss, m.milliseconds, m.tokensPerSecond, validation);
  }
  if (json) std::fprintf(file, "]\n");
  return closeWritten(file, path);
}

bool plotLoss(const std::string& path, const std::vector<Metric>& metrics, double floor) {
  const std::string data = path + ".dat", validation = path + ".val.dat";
  FILE* file = std::fopen(data.c_str(), "w");
  FILE* validationFile = std::fopen(validation.c_str(), "w");
  if (file == nullptr || validationFile == nullptr) {
    if (file != nullptr) std::fclose(file);
    if (validationFile != nullptr) std::fclose(validationFile);
    std::remove(data.c_str());
    std::fprintf(stderr, "loom-train: cannot write the plot's data beside %s\n", path.c_str());
    return false;
  }
  bool anyValidation = false;
  for (const Metric& m : metrics) {
    std::fprintf(file, "%d %.9g\n", m.step, m.loss);
    if (!std::isnan(m.validationLoss)) {
      std::fprintf(validationFile, "%d %.9g\n", m.step, m.validationLoss);
      anyValidation = true;
    }
  }
  std::fclose(file);
  std::fclose(validationFile);
  const char* terminal = path.ends_with(".svg") ? "svg" : "pngcairo";
  std::string script = "set terminal " + std::string(terminal) + " size 800,500; set output '" + path +
                       "'; set xlabel 'step'; set ylabel 'loss (nats)'; set grid; plot '" + data +
                       "' with lines title 'training loss'";
  if (anyValidation) script += ", '" + validation + "' with linespoints title 'validation loss'";
  if (floor > 0) script += ", " + std::to_string(floor) + " with lines dashtype 2 title 'entropy rate'";
  const std::string command = "gnuplot -e \"" + script + "\" 2>&1";
  const bool drawn = std::system(command.c_str()) == 0;
  if (!drawn) std::fprintf(stderr, "loom-train: gnuplot could not draw %s (is gnuplot installed?)\n", path.c_str());
  std::remove(data.c_str());
  std::remove(validation.c_str());
  return drawn;
}

bool plotTimeline(const std::string& path, const pipeline::Timeline& timeline, const std::string& title) {
  int stages = 0;
  for (const pipeline::Span& span : timeline.spans) stages = std::max(stages, span.stage + 1);
  std::string script = "set terminal pngcairo size 1200," + std::to_string(160 + 60 * stages) + "; set output '" +
                       path + "'; set title '" + title + "'; set xlabel 'ms'; set ylabel 'stage'; set yrange [-0.6:";
  script += std::to_string(stages - 0.4) +
            "] reverse; set ytics 1; set xrange [0:" + std::to_string(timeline.makespan * 1e3) + "]; ";
  for (const pipeline::Span& span : timeline.spans) {
    const char* color = span.action.op == pipeline::Op::kForward    ? "#3b6fb6"
                        : span.action.op == pipeline::Op::kBackward ? "#3f9b4a"
                                                                    : "#e08a2c";
    char box[200];
    std::snprintf(box, sizeof(box),
                  "set object rect from %.6f,%.2f to %.6f,%.2f fc rgb '%s' fs solid 0.9 border lc rgb 'white'; ",
                  span.start * 1e3, span.stage - 0.35, span.end * 1e3, span.stage + 0.35, color);
    script += box;
  }
  script +=
      "set key outside right; plot NaN title 'F' lc rgb '#3b6fb6' lw 8, NaN title 'B' lc rgb '#3f9b4a' lw 8, NaN title "
      "'W' lc rgb "
      "'#e08a2c' lw 8";
  const std::string scriptPath = path + ".gp";
  if (!writeText(scriptPath, script + "\n")) return false;
  const bool drawn = std::system(("gnuplot '" + scriptPath + "' 2>&1").c_str()) == 0;
  if (!drawn) std::fprintf(stderr, "loom-train: gnuplot could not draw %s (is gnuplot installed?)\n", path.c_str());
  std::remove(scriptPath.c_str());
  return drawn;
}

}  // namespace loom::train
