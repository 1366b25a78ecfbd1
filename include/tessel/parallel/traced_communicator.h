// A communicator that writes every call to the synchronisation trace (tessel/core/sync_trace.h):
// "<label> rank r/n #seq <call> <bytes>: start" before it and ": done" after, the call's sequence
// number counted per communicator, and for a ring exchange or an asynchronous all-to-all also when
// its wait returns. Groups split from it are traced too, labelled "<label>/split(color)". Two ranks whose last lines name different
// calls or sequence numbers disagree on the order or the count of collectives.
#pragma once

#include <memory>
#include <string>

#include "tessel/parallel/communicator.h"

namespace tessel {

// Wraps `inner` (owned). Writes only while sync_trace_enabled().
std::unique_ptr<Communicator> make_traced_communicator(std::unique_ptr<Communicator> inner, std::string label);

}  // namespace tessel
