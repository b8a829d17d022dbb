// The library's public API from a user's side (links ddp::ddp only): a
// one-rank session's collectives, the errors a user meets, and what
// DistributedDataParallel does around backward.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/script.h>
#include <torch/torch.h>

#include <thread>

#include "ddp/ddp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// What DDP_STORE_SECRET holds for these tests' jobs.
constexpr char kSecret[] = "0123456789abcdef-test-secret";

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::unique_ptr<ddp::Session> Alone(const std::string& backend = "auto") {
  ddp::Session::Options options;
  options.master_port = FreePort();
  options.store_secret = kSecret;
  options.local_world_size = 1;
  options.backend = backend;
  options.timeout_seconds = 30;
  return ddp::Session::Start(options);
}

template <typename F>
std::string ErrorOf(F f) {
  try {
    f();
  } catch (const ddp::Error& e) {
    return e.what();
  }
  return "(no ddp::Error)";
}

TEST(Session, AloneOnEachTransport_CollectivesAreIdentity) {
  for (const std::string backend : {"gloo", "shm"}) {
    auto session = Alone(backend);
    EXPECT_EQ(session->backend(), backend);
    EXPECT_EQ(session->rank(), 0);
    EXPECT_EQ(session->world_size(), 1);
    torch::Tensor t = torch::arange(4, torch::kFloat32);
    session->all_reduce_sum(t);
    EXPECT_TRUE(torch::equal(t, torch::arange(4, torch::kFloat32)));
    torch::Tensor ints = torch::arange(3, torch::kLong);
    session->broadcast(ints);
    EXPECT_TRUE(torch::equal(ints, torch::arange(3, torch::kLong)));
    session->barrier();
  }
}

TEST(Session, BadOptions_ErrorSaysWhatIsWrong) {
  ddp::Session::Options options;
  options.rank = 2;
  options.world_size = 2;
  EXPECT_THAT(ErrorOf([&] { ddp::Session::Start(options); }), HasSubstr("[0, WORLD_SIZE)"));
  options.rank = 0;
  options.master_port = 70000;
  EXPECT_THAT(ErrorOf([&] { ddp::Session::Start(options); }), HasSubstr("not a TCP port"));
  options.master_port = FreePort();
  options.backend = "mpi";
  EXPECT_THAT(ErrorOf([&] { ddp::Session::Start(options); }), HasSubstr("auto, gloo or shm"));
  auto session = Alone();
  torch::Tensor doubles = torch::zeros({2}, torch::kFloat64);
  EXPECT_THAT(ErrorOf([&] { session->all_reduce_sum(doubles); }), HasSubstr("float32"));
}

TEST(Session, PortTaken_ErrorNamesTheAddress) {
  // Rank 0 on a port another process listens on.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ddp::Session::Options options;
  options.master_port = ntohs(addr.sin_port);
  options.store_secret = kSecret;
  options.timeout_seconds = 5;
  EXPECT_THAT(ErrorOf([&] { ddp::Session::Start(options); }),
              HasSubstr("can't serve the rendezvous"));
  ::close(fd);
}

std::unique_ptr<ddp::Session> StartRank(int rank, int world, int port,
                                        const std::string& secret = kSecret) {
  ddp::Session::Options options;
  options.rank = rank;
  options.world_size = world;
  options.master_port = port;
  options.store_secret = secret;
  options.allow_anonymous_store = secret.empty();
  options.local_world_size = world;
  options.timeout_seconds = 60;
  return ddp::Session::Start(options);
}

TEST(Session, NoOrShortStoreSecret_ErrorSaysWhatToSet) {
  ddp::Session::Options options;
  options.master_port = FreePort();
  options.timeout_seconds = 5;
  EXPECT_THAT(ErrorOf([&] { ddp::Session::Start(options); }),
              AllOf(HasSubstr("DDP_STORE_SECRET is not set"), HasSubstr("openssl rand -hex 16"),
                    HasSubstr("DDP_ALLOW_ANONYMOUS_STORE=1")));
  options.store_secret = "hunter2";
  EXPECT_THAT(ErrorOf([&] { ddp::Session::Start(options); }),
              AllOf(HasSubstr("at least 16"), Not(HasSubstr("hunter2"))));
}

TEST(Session, RendezvousCallerWithoutTheSecret_Unauthenticated_JobUntouched) {
  const int port = FreePort();
  std::unique_ptr<ddp::Session> job[2];
  std::thread other([&] { job[1] = StartRank(1, 2, port); });
  job[0] = StartRank(0, 2, port);
  other.join();
  ASSERT_TRUE(job[0] && job[1]);
  // Another local user reaches rank 0's store: with no secret, or a guess.
  const std::string none = ErrorOf([&] { StartRank(1, 2, port, ""); });
  EXPECT_THAT(none, AllOf(HasSubstr("the rendezvous at"), HasSubstr("none was sent"),
                          HasSubstr("DDP_STORE_SECRET")));
  const std::string guess = ErrorOf([&] { StartRank(1, 2, port, "guessed-secret-0123456789"); });
  EXPECT_THAT(guess, AllOf(HasSubstr("the rendezvous at"), HasSubstr("same on every rank"),
                           Not(HasSubstr("guessed-secret")), Not(HasSubstr(kSecret))));
  EXPECT_THAT(none, Not(HasSubstr(kSecret)));
  // The job goes on.
  std::thread sum([&] {
    torch::Tensor t = torch::ones({1});
    job[1]->all_reduce_sum(t);
  });
  torch::Tensor t = torch::ones({1});
  job[0]->all_reduce_sum(t);
  sum.join();
  EXPECT_EQ(t.item<float>(), 2.0f);
}

TEST(Session, AnonymousStoreAllowedOnEveryRank_Trains) {
  const int port = FreePort();
  std::unique_ptr<ddp::Session> job[2];
  std::thread other([&] { job[1] = StartRank(1, 2, port, ""); });
  job[0] = StartRank(0, 2, port, "");
  other.join();
  ASSERT_TRUE(job[0] && job[1]);
}

TEST(Session, SecondJobOnAPortInUse_FailsAtOnceNamingThePort) {
  const int port = FreePort();
  std::unique_ptr<ddp::Session> first[2];
  std::thread other([&] { first[1] = StartRank(1, 2, port); });
  first[0] = StartRank(0, 2, port);
  other.join();
  ASSERT_TRUE(first[0] && first[1]);
  const std::string port_text = std::to_string(port);
  // The second job's rank 0 can't serve the port; its rank 1 reaches the
  // first job's rendezvous and is told so, rather than waiting out the
  // timeout.
  EXPECT_THAT(ErrorOf([&] { StartRank(0, 2, port); }),
              AllOf(HasSubstr("can't serve the rendezvous at 127.0.0.1:" + port_text),
                    HasSubstr("port is in use")));
  EXPECT_THAT(ErrorOf([&] { StartRank(1, 2, port); }),
              AllOf(HasSubstr("rank 1 already joined the rendezvous"),
                    HasSubstr("another job is using MASTER_PORT=" + port_text)));
  // The first job is untouched.
  torch::Tensor one = torch::ones({1});
  std::thread sum([&] {
    torch::Tensor t = torch::ones({1});
    first[1]->all_reduce_sum(t);
  });
  first[0]->all_reduce_sum(one);
  sum.join();
  EXPECT_EQ(one.item<float>(), 2.0f);
}

TEST(DistributedSampler, RankOutsideTheWorld_Error) {
  EXPECT_THAT(ErrorOf([] { ddp::DistributedSampler(10, 3, 3); }), HasSubstr("rank 3"));
}

TEST(DistributedSampler, EachResetStartsTheNextEpoch_SetEpochChooses) {
  ddp::DistributedSampler sampler(8, 0, 1, {/*seed=*/3});
  EXPECT_EQ(sampler.epoch(), 0u);
  sampler.reset();
  const std::vector<size_t> first = *sampler.next(8);
  sampler.reset();
  EXPECT_EQ(sampler.epoch(), 1u);
  EXPECT_NE(*sampler.next(8), first);
  sampler.set_epoch(0);
  sampler.reset();
  EXPECT_EQ(*sampler.next(8), first);
  EXPECT_FALSE(sampler.next(8).has_value());
}

TEST(DistributedSampler, EpochStartedAtACursor_SizeIsWhatItHandsOut) {
  ddp::DistributedSampler sampler(10, 0, 2);
  EXPECT_EQ(sampler.size(), 5u);
  sampler.set_cursor(6);
  sampler.reset();
  EXPECT_EQ(sampler.size(), 2u);  // the 4 positions left, split over 2 ranks
  EXPECT_EQ(sampler.next(8)->size(), 2u);
}

TEST(DistributedDataParallel, Backward_GradientsReadyWithoutAnyCall_NoSyncAccumulates) {
  auto session = Alone();
  torch::manual_seed(0);
  torch::nn::Linear net(3, 2);
  ddp::DistributedDataParallel ddp(*session, net.ptr());
  EXPECT_EQ(ddp.parameter_names(), (std::vector<std::string>{"weight", "bias"}));
  const torch::Tensor x = torch::ones({4, 3});
  net->forward(x).sum().backward();
  EXPECT_TRUE(torch::allclose(net->bias.grad(), torch::full({2}, 4.0f)));
  EXPECT_EQ(ddp.last_reduction().buckets, 1u);
  // zero_grad, as the optimizers do it, keeps working on bucket memory.
  torch::optim::SGD sgd(net->parameters(), 0.1);
  sgd.zero_grad();
  {
    auto local_only = ddp.no_sync();
    net->forward(x).sum().backward();
    EXPECT_THAT(ErrorOf([&] { auto again = ddp.no_sync(); }), HasSubstr("don't nest"));
  }
  net->forward(x).sum().backward();
  EXPECT_TRUE(torch::allclose(net->bias.grad(), torch::full({2}, 8.0f)));
  sgd.step();
}

TEST(DistributedDataParallel, BackwardReachingNoParameter_StillASynchronizedStep) {
  auto session = Alone();
  torch::nn::Linear net(3, 2);
  ddp::DistributedDataParallel ddp(*session, net.ptr());
  net->forward(torch::ones({4, 3})).sum().backward();
  EXPECT_EQ(ddp.last_reduction().unused_parameters, 0u);
  // A loss computed from the output detached: no parameter is reached, yet
  // the step takes place (with every rank, in a world of several), its
  // parameters all unused.
  torch::Tensor detached = net->forward(torch::ones({4, 3})).detach().requires_grad_();
  detached.sum().backward();
  EXPECT_EQ(ddp.last_reduction().unused_parameters, 2u);
  EXPECT_EQ(ddp.last_reduction().globally_unused_parameters, 2u);
  // The parameters' gradients stay as they were.
  EXPECT_TRUE(torch::allclose(net->bias.grad(), torch::full({2}, 4.0f)));
}

TEST(DistributedDataParallel, TorchScriptModuleWithoutOptions_TrainsAndIsElasticState) {
  auto session = Alone();
  torch::jit::Module module("Scaled");
  module.register_parameter("w", torch::ones({2}).requires_grad_(), /*is_buffer=*/false);
  module.define("def forward(self, x):\n    return x * self.w\n");
  ddp::DistributedDataParallel ddp(*session, module);  // no Options{}
  EXPECT_EQ(ddp.parameter_names(), std::vector<std::string>{"w"});
  module.forward({torch::full({2}, 3.0f)}).toTensor().sum().backward();
  EXPECT_TRUE(torch::allclose(module.attr("w").toTensor().grad(), torch::full({2}, 3.0f)));
  ddp::Session::ElasticState state;
  state.script_module = &module;
  // An optimizer a state can't carry is fine without a coordinator: nothing
  // re-forms, so nothing travels.
  std::vector<torch::Tensor> params{module.attr("w").toTensor()};
  torch::optim::RMSprop rmsprop(params, torch::optim::RMSpropOptions(0.01));
  state.optimizer = &rmsprop;
  session->set_elastic_state(state);  // accepted (nothing re-forms without a coordinator)
  ddp::Session::ElasticState neither;
  EXPECT_THAT(ErrorOf([&] { session->set_elastic_state(neither); }), HasSubstr("one of them"));
}

TEST(DistributedDataParallel, BackwardThatThrowsPartWay_NextBackwardStillAverages) {
  auto session = Alone();
  torch::nn::Linear first(3, 3), second(3, 2);
  auto both = torch::nn::Sequential(first, second);
  ddp::DistributedDataParallel ddp(*session, both.ptr());
  const torch::Tensor x = torch::ones({4, 3});
  torch::Tensor h = first->forward(x);
  // Runs after `second`'s gradients (which arm the reducer), before `first`'s.
  h.register_hook([](torch::Tensor) -> torch::Tensor { throw std::runtime_error("boom"); });
  EXPECT_THROW(second->forward(h).sum().backward(), std::exception);
  both->zero_grad();
  second->forward(first->forward(x)).sum().backward();
  EXPECT_TRUE(torch::allclose(second->bias.grad(), torch::full({2}, 4.0f)));
  EXPECT_TRUE(first->bias.grad().defined());
  EXPECT_EQ(ddp.last_reduction().buckets, 1u);
}

}  // namespace
