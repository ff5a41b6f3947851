// OpSink's role of layer collectives.
#include "layouts/op_sink.h"

#include <stdexcept>

namespace megatune::layouts {

OpRole layer_comm_role(OpKind kind, CommGroup group) {
  switch (group) {
    case CommGroup::kTensor:
      return OpRole::kTensorParallel;
    case CommGroup::kContext:
      return kind == OpKind::kSend || kind == OpKind::kRecv ? OpRole::kContextParallelRing
                                                            : OpRole::kContextParallelGather;
    case CommGroup::kExpert:
    case CommGroup::kExpertTensor:
    case CommGroup::kTensorExpert:
      return OpRole::kExpertDispatch;
    default:
      throw std::logic_error(std::string("step program: no layer collective runs over group ") +
                             comm_group_name(group));
  }
}

}  // namespace megatune::layouts
