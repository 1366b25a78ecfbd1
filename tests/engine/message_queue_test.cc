// The shared-memory broadcast queue: order, broadcast to every reader, messages longer than the
// ring, a full ring holding the writer back, close, another process as the reader, bad shapes.
#include "tessel/engine/message_queue.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "tessel/core/error.h"

namespace tessel::engine {
namespace {

using std::chrono::milliseconds;

std::string unique_name(const std::string& tag) { return "/tessel-test-" + std::to_string(getpid()) + "-" + tag; }

TEST(MessageQueue, EveryReaderGetsEveryMessageInOrder) {
  MessageQueue writer = MessageQueue::create(unique_name("order"), {2, 4, 64});
  MessageQueue first = MessageQueue::open(writer.name(), 0);
  MessageQueue second = MessageQueue::open(writer.name(), 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(writer.send("message " + std::to_string(i), milliseconds(100)));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(first.receive(milliseconds(100)), "message " + std::to_string(i));
    EXPECT_EQ(second.receive(milliseconds(100)), "message " + std::to_string(i));
  }
  EXPECT_EQ(first.receive(milliseconds(10)), std::nullopt);
  EXPECT_EQ(writer.pending_slots(0), 0u);
}

TEST(MessageQueue, FullRingHoldsTheWriterUntilTheSlowestReaderReads) {
  MessageQueue writer = MessageQueue::create(unique_name("full"), {2, 2, 64});
  MessageQueue fast = MessageQueue::open(writer.name(), 0);
  MessageQueue slow = MessageQueue::open(writer.name(), 1);
  ASSERT_TRUE(writer.send("a", milliseconds(10)));
  ASSERT_TRUE(writer.send("b", milliseconds(10)));
  EXPECT_EQ(fast.receive(milliseconds(10)), "a");
  EXPECT_FALSE(writer.send("c", milliseconds(20)));  // the slow reader still holds both slots
  EXPECT_EQ(slow.receive(milliseconds(10)), "a");
  EXPECT_TRUE(writer.send("c", milliseconds(20)));
  EXPECT_EQ(slow.receive(milliseconds(10)), "b");
  EXPECT_EQ(slow.receive(milliseconds(10)), "c");
}

TEST(MessageQueue, MessagesLongerThanTheRingPassWhole) {
  MessageQueue writer = MessageQueue::create(unique_name("long"), {1, 3, 64});
  MessageQueue reader = MessageQueue::open(writer.name(), 0);
  std::string big(64 * 50 + 17, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  std::optional<std::string> received;
  std::thread consumer([&] { received = reader.receive(milliseconds(5000)); });
  EXPECT_TRUE(writer.send(big, milliseconds(5000)));
  consumer.join();
  EXPECT_EQ(received, big);
  ASSERT_TRUE(writer.send("", milliseconds(10)));  // an empty message is a message
  EXPECT_EQ(reader.receive(milliseconds(10)), "");
}

TEST(MessageQueue, AWriterStuckMidMessageClosesTheQueue) {
  MessageQueue writer = MessageQueue::create(unique_name("stuck"), {1, 2, 64});
  MessageQueue reader = MessageQueue::open(writer.name(), 0);
  EXPECT_FALSE(writer.send(std::string(64 * 3, 'x'), milliseconds(20)));
  EXPECT_EQ(reader.receive(milliseconds(10)), std::nullopt);
  EXPECT_FALSE(writer.send("after", milliseconds(10)));
}

TEST(MessageQueue, CloseWakesAWaitingReader) {
  MessageQueue writer = MessageQueue::create(unique_name("close"), {1, 2, 64});
  MessageQueue reader = MessageQueue::open(writer.name(), 0);
  ASSERT_TRUE(writer.send("last", milliseconds(10)));
  writer.close();
  EXPECT_EQ(reader.receive(milliseconds(10)), "last");  // what was sent is still delivered
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(reader.receive(milliseconds(5000)), std::nullopt);
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(1000));
}

TEST(MessageQueue, AnotherProcessReadsAndAnswers) {
  MessageQueue requests = MessageQueue::create(unique_name("xreq"), {1, 4, 64});
  MessageQueue replies = MessageQueue::create(unique_name("xrep"), {1, 4, 64});
  MessageQueue reply_reader = MessageQueue::open(replies.name(), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    MessageQueue in = MessageQueue::open(requests.name(), 0);
    MessageQueue out = MessageQueue::open(replies.name(), -1);
    for (;;) {
      const std::optional<std::string> message = in.receive(milliseconds(5000));
      if (!message || *message == "stop") _exit(message ? 0 : 1);
      out.send("echo " + *message + " " + std::string(300, 'y'), milliseconds(5000));
    }
  }
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(requests.send(std::to_string(i), milliseconds(1000)));
    EXPECT_EQ(reply_reader.receive(milliseconds(5000)), "echo " + std::to_string(i) + " " + std::string(300, 'y'));
  }
  ASSERT_TRUE(requests.send("stop", milliseconds(1000)));
  int status = -1;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(MessageQueue, BadShapesNamesAndReadersAreErrors) {
  EXPECT_THROW(MessageQueue::create(unique_name("r0"), {0, 4, 64}), Error);
  EXPECT_THROW(MessageQueue::create(unique_name("s1"), {1, 1, 64}), Error);
  EXPECT_THROW(MessageQueue::create(unique_name("b8"), {1, 4, 8}), Error);
  EXPECT_THROW(MessageQueue::create("no-slash", {1, 4, 64}), Error);
  EXPECT_THROW(MessageQueue::open(unique_name("missing"), 0), Error);
  MessageQueue writer = MessageQueue::create(unique_name("readers"), {2, 4, 64});
  EXPECT_THROW(MessageQueue::open(writer.name(), 2), Error);
  MessageQueue as_writer = MessageQueue::open(writer.name(), -1);
  EXPECT_THROW(as_writer.receive(milliseconds(1)), Error);
}

}  // namespace
}  // namespace tessel::engine
