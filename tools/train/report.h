// What loom-train prints and writes besides its training (loom-train.cc describes the program): sizes, numbers
// and times as text, the metrics file, and the plots of the loss and of a pipeline's timeline (through gnuplot).
#pragma once

#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace loom::train {

std::string humanBytes(double bytes);

std::string fixed(double value, int decimals);

std::string duration(double seconds);

struct Metric {
  int step;
  float loss;
  double milliseconds, tokensPerSecond;
  float validationLoss;  // NaN: not evaluated at this step
};

// Each writer returns false, having said why on stderr, when its file could not be written.
bool writeMetrics(const std::string& path, const std::vector<Metric>& metrics);

// The loss curve through gnuplot: PNG, or SVG for a path ending in .svg.
bool plotLoss(const std::string& path, const std::vector<Metric>& metrics, double floor);

// The measured timeline as a PNG (through gnuplot): a row per stage, a box per action (F blue, B green, W orange).
bool plotTimeline(const std::string& path, const loom::parallel::pipeline::Timeline& timeline,
                  const std::string& title);

bool writeText(const std::string& path, const std::string& text);

}  // namespace loom::train
