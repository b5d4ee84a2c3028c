// NCCL communicators (borrowed or owned, abortable from another thread) and run_on_gpus(), the one-thread-per-GPU
// launcher of tests and benchmarks. NVLink multicast (NVLS) is switched off in the environment before any
// communicator is created: on the machines moekit targets it must stay off.
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "moekit/device.h"
#include "moekit/error.h"
#include "moekit/expert_parallel.h"

#if MOEKIT_HAS_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#endif

namespace moekit {

struct Communicator::State {
  CommHandle comm = nullptr;
  int world_size = 0, rank = 0, device = 0;
  bool owned = false;
  std::atomic<bool> aborted{false};
};

#if MOEKIT_HAS_CUDA
namespace {

void nccl_check(ncclResult_t r, std::string_view call) {
  if (r != ncclSuccess) throw CudaError("ep", fmt::format("{} failed: {}", call, ncclGetErrorString(r)));
}

void disable_nvls() {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
}

void check_world_size(int world_size) {
  if (world_size < 1 || world_size > kMaxWorldSize)
    throw InvalidArgument("ep", fmt::format("world_size ({}) must be in 1..{}", world_size, kMaxWorldSize));
}

}  // namespace

Communicator Communicator::borrow(CommHandle comm) {
  if (comm == nullptr) throw InvalidArgument("ep", "comm (null) must be an NCCL communicator");
  auto nc = static_cast<ncclComm_t>(comm);
  Communicator c;
  c.state_->comm = comm;
  nccl_check(ncclCommCount(nc, &c.state_->world_size), "ncclCommCount");
  nccl_check(ncclCommUserRank(nc, &c.state_->rank), "ncclCommUserRank");
  nccl_check(ncclCommCuDevice(nc, &c.state_->device), "ncclCommCuDevice");
  return c;
}

CommUniqueId Communicator::unique_id() {
  disable_nvls();
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  CommUniqueId out;
  static_assert(sizeof(id) <= sizeof(out.bytes));
  std::memcpy(out.bytes.data(), &id, sizeof(id));
  return out;
}

Communicator Communicator::init_rank(const CommUniqueId& id, int world_size, int rank, int device) {
  check_world_size(world_size);
  if (rank < 0 || rank >= world_size)
    throw InvalidArgument("ep", fmt::format("rank ({}) must be in 0..{}", rank, world_size - 1));
  if (device < 0 || device >= cuda_device_count())
    throw InvalidArgument("ep", fmt::format("device ({}) must be in 0..{}", device, cuda_device_count() - 1));
  disable_nvls();
  ncclUniqueId nid;
  std::memcpy(&nid, id.bytes.data(), sizeof(nid));
  if (cudaSetDevice(device) != cudaSuccess) throw CudaError("ep", fmt::format("cudaSetDevice({}) failed", device));
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, world_size, nid, rank), "ncclCommInitRank");
  Communicator c;
  c.state_->comm = comm;
  c.state_->world_size = world_size;
  c.state_->rank = rank;
  c.state_->device = device;
  c.state_->owned = true;
  return c;
}

std::vector<Communicator> Communicator::init_all(int world_size) {
  check_world_size(world_size);
  if (cuda_device_count() < world_size)
    throw InvalidArgument(
        "ep", fmt::format("world_size ({}) must be <= visible CUDA devices ({})", world_size, cuda_device_count()));
  disable_nvls();
  std::vector<ncclComm_t> comms(static_cast<size_t>(world_size));
  std::vector<int> devs(static_cast<size_t>(world_size));
  for (int i = 0; i < world_size; ++i) devs[i] = i;
  nccl_check(ncclCommInitAll(comms.data(), world_size, devs.data()), "ncclCommInitAll");
  std::vector<Communicator> out;
  for (int i = 0; i < world_size; ++i) {
    Communicator c;
    c.state_->comm = comms[i];
    c.state_->world_size = world_size;
    c.state_->rank = i;
    c.state_->device = i;
    c.state_->owned = true;
    out.push_back(std::move(c));
  }
  return out;
}

void Communicator::abort() {
  if (!state_ || state_->comm == nullptr || !state_->owned) return;
  if (!state_->aborted.exchange(true)) ncclCommAbort(static_cast<ncclComm_t>(state_->comm));
}

void Communicator::release() noexcept {
  if (state_ && state_->owned && state_->comm != nullptr && !state_->aborted)
    ncclCommDestroy(static_cast<ncclComm_t>(state_->comm));  // errors ignored: a destructor must not throw
  state_.reset();
}

Communicator::~Communicator() {
  release();
}

Communicator& Communicator::operator=(Communicator&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
  }
  return *this;
}

void run_on_gpus(int world_size, const std::function<void(int rank, Communicator& comm)>& fn) {
  std::vector<Communicator> comms = Communicator::init_all(world_size);
  std::mutex mu;
  std::exception_ptr first;
  auto fail_all = [&](std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!first) {
      first = e;
      for (Communicator& c : comms) c.abort();  // peers blocked in a collective fail instead of hanging
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r)
    threads.emplace_back([&, r] {
      try {
        if (cudaSetDevice(r) != cudaSuccess) throw CudaError("ep", fmt::format("cudaSetDevice({}) failed", r));
        fn(r, comms[r]);
      } catch (...) {
        fail_all(std::current_exception());
      }
    });
  for (std::thread& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

#else

Communicator Communicator::borrow(CommHandle) {
  throw NotSupported("ep", "moekit was built without CUDA");
}
CommUniqueId Communicator::unique_id() {
  throw NotSupported("ep", "moekit was built without CUDA");
}
Communicator Communicator::init_rank(const CommUniqueId&, int, int, int) {
  throw NotSupported("ep", "moekit was built without CUDA");
}
std::vector<Communicator> Communicator::init_all(int) {
  throw NotSupported("ep", "moekit was built without CUDA");
}
void Communicator::abort() {}
void Communicator::release() noexcept {
  state_.reset();
}
Communicator::~Communicator() = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;
void run_on_gpus(int, const std::function<void(int, Communicator&)>&) {
  throw NotSupported("ep", "moekit was built without CUDA");
}

#endif

Communicator::Communicator() : state_(std::make_shared<State>()) {}
Communicator::Communicator(Communicator&&) noexcept = default;
CommHandle Communicator::handle() const {
  return state_ ? state_->comm : nullptr;
}
int Communicator::world_size() const {
  return state_ ? state_->world_size : 0;
}
int Communicator::rank() const {
  return state_ ? state_->rank : 0;
}
int Communicator::device() const {
  return state_ ? state_->device : 0;
}
bool Communicator::valid() const {
  return state_ && state_->comm != nullptr;
}

}  // namespace moekit
