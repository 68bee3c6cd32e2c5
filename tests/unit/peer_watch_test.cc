// PeerWatch, on processes forked for the test: a running one, a stopped one (SIGSTOP), one killed by a signal and
// one that exited, read while they are zombies (how each ended), and once reaped (ended, how unknown).
#include "src/core/peer_watch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace loom {
namespace {

pid_t forkSleeper() {
  pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

// Waits until `pid` has ended without reaping it (it stays a zombie).
void waitEnded(pid_t pid) {
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);
}

// Waits until `pid` is stopped (without consuming the report).
void waitStopped(pid_t pid) {
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(pid), &info, WSTOPPED | WNOWAIT), 0);
}

TEST(PeerWatch, TellsRunningStoppedKilledExitedAndGone) {
  const pid_t running = forkSleeper(), stopped = forkSleeper(), killed = forkSleeper();
  const pid_t exited = fork();
  if (exited == 0) _exit(7);
  ASSERT_GT(running, 0);
  ASSERT_GT(stopped, 0);
  ASSERT_GT(killed, 0);
  ASSERT_GT(exited, 0);
  PeerWatch watch;
  watch.add(1, running);
  watch.add(2, stopped);
  watch.add(3, killed);
  watch.add(4, exited);
  kill(stopped, SIGSTOP);
  kill(killed, SIGKILL);
  waitStopped(stopped);
  waitEnded(killed);
  waitEnded(exited);
  int detail = -1;
  EXPECT_EQ(watch.state(1, &detail), PeerWatch::State::kRunning);
  EXPECT_EQ(watch.state(2, &detail), PeerWatch::State::kStopped);
  EXPECT_EQ(watch.state(3, &detail), PeerWatch::State::kKilled);
  EXPECT_EQ(detail, SIGKILL);
  EXPECT_EQ(watch.state(4, &detail), PeerWatch::State::kExited);
  EXPECT_EQ(detail, 7);
  EXPECT_EQ(watch.state(9, &detail), PeerWatch::State::kRunning) << "a rank not watched";
  EXPECT_EQ(watch.firstDead([](int rank) { return rank <= 2; }), -1);
  EXPECT_GE(watch.firstDead(), 3);
  // Reaped: ended, how no longer known.
  for (pid_t pid : {killed, exited}) ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  EXPECT_EQ(watch.state(3, &detail), PeerWatch::State::kGone);
  EXPECT_EQ(watch.state(4, &detail), PeerWatch::State::kGone);
  for (pid_t pid : {running, stopped}) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
}

}  // namespace
}  // namespace loom
