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

void writeMetrics(const std::string& path, const std::vector<Metric>& metrics);

void plotLoss(const std::string& path, const std::vector<Metric>& metrics, double floor);

// The measured timeline as a PNG (through gnuplot): a row per stage, a box per action (F blue, B green, W orange).
void plotTimeline(const std::string& path, const loom::parallel::pipeline::Timeline& timeline,
                  const std::string& title);

}  // namespace loom::train
