// SingleRankCommunicator: the one-process implementation of the collectives (identities and copies).
#include "executor/runtime/communicator.h"

#include <stdexcept>
#include <string>

#include "executor/backend/backend.h"

namespace megatune::executor {

void SingleRankCommunicator::all_gather(CommGroup, Tensor input, Tensor output) {
  if (input.data != output.data) backend_.copy(input, output);
}

void SingleRankCommunicator::reduce_scatter(CommGroup, Tensor input, Tensor output) {
  if (input.data != output.data) backend_.copy(input, output);
}

void SingleRankCommunicator::send(CommGroup group, Tensor, int peer) {
  throw std::logic_error(std::string("send to rank ") + std::to_string(peer) + " of group " +
                         layouts::comm_group_name(group) + " in a single-rank run");
}

void SingleRankCommunicator::recv(CommGroup group, Tensor, int peer) {
  throw std::logic_error(std::string("recv from rank ") + std::to_string(peer) + " of group " +
                         layouts::comm_group_name(group) + " in a single-rank run");
}

}  // namespace megatune::executor
