#include "cuda/vae_row_split.h"

#include "cuda/vae_kernels.h"

namespace tessel::vae::cuda {
namespace {

constexpr size_t kFloat = sizeof(float);

TensorView floats(float* data, int64_t count, Device device) { return TensorView(data, DType::kF32, device, {count}); }

// `rows` rows of `width` floats from each of `images` planes of src (pitch src_plane floats) into
// dst's planes (pitch dst_plane floats), on `stream`; a null src writes zeros.
void copy_rows(const float* src, int64_t src_plane, float* dst, int64_t dst_plane, int64_t rows, int64_t width, int64_t images,
               cudaStream_t stream) {
  if (rows == 0 || images == 0) return;
  const size_t bytes = static_cast<size_t>(rows * width) * kFloat;
  if (src == nullptr) {
    check_cuda(cudaMemset2DAsync(dst, static_cast<size_t>(dst_plane) * kFloat, 0, bytes, static_cast<size_t>(images), stream),
               "zero halo rows");
    return;
  }
  check_cuda(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_plane) * kFloat, src, static_cast<size_t>(src_plane) * kFloat, bytes,
                               static_cast<size_t>(images), cudaMemcpyDeviceToDevice, stream),
             "copy of band rows");
}

}  // namespace

ExecContext DeviceRowSplit::context(const DecodeContext& dc) const {
  ExecContext ctx;
  ctx.device = device_;
  ctx.stream = dc.stream;
  return ctx;
}

DeviceFrames DeviceRowSplit::with_halo(const DecodeContext& dc, const DeviceFrames& x) const {
  const int64_t images = x.channels * x.frames, h = x.height, w = x.width, edge = images * w;
  // One row of every image in each: this band's top and bottom rows, the rows above and below it.
  DeviceFrames rows = dc.frames(1, 1, 4, edge);
  float *top = rows.data(), *bottom = top + edge, *above = bottom + edge, *below = above + edge;
  copy_rows(x.data(), h * w, top, w, 1, w, images, dc.stream);
  copy_rows(x.data() + (h - 1) * w, h * w, bottom, w, 1, w, images, dc.stream);
  group_.neighbour_exchange(context(dc), floats(top, edge, device_), floats(bottom, edge, device_), floats(above, edge, device_),
                            floats(below, edge, device_));
  DeviceFrames out = dc.frames(x.channels, x.frames, h + 2, w);
  // Row -1 is the previous rank's bottom row, row h the next rank's top row; zeros at the frame's edges.
  copy_rows(bands_.rank() > 0 ? above : nullptr, w, out.data(), (h + 2) * w, 1, w, images, dc.stream);
  copy_rows(x.data(), h * w, out.data() + w, (h + 2) * w, h, w, images, dc.stream);
  copy_rows(bands_.rank() + 1 < bands_.ranks() ? below : nullptr, w, out.data() + (h + 1) * w, (h + 2) * w, 1, w, images, dc.stream);
  return out;
}

DeviceFrames DeviceRowSplit::whole(const DecodeContext& dc, const DeviceFrames& band) const {
  const int64_t scale = bands_.scale_of(band.height), images = band.channels * band.frames, w = band.width;
  // Every rank sends as many rows as the tallest band (a shorter band's last rows are not read).
  const int64_t padded = scale * bands_.max_rows(), per_rank = images * padded * w;
  DeviceFrames send = dc.frames(1, 1, 1, per_rank), all = dc.frames(1, 1, 1, per_rank * bands_.ranks());
  copy_rows(band.data(), band.plane(), send.data(), padded * w, band.height, w, images, dc.stream);
  group_.all_gather(context(dc), floats(send.data(), per_rank, device_), floats(all.data(), per_rank * bands_.ranks(), device_));
  DeviceFrames out = dc.frames(band.channels, band.frames, scale * bands_.height(), w);
  for (int r = 0; r < bands_.ranks(); ++r)
    copy_rows(all.data() + r * per_rank, padded * w, out.data() + scale * bands_.begin(r) * w, out.plane(), scale * bands_.rows(r), w,
              images, dc.stream);
  return out;
}

DeviceFrames DeviceRowSplit::band_of(const DecodeContext& dc, const DeviceFrames& whole) const {
  const int64_t scale = whole.height / bands_.height(), rank = bands_.rank();
  DeviceFrames out = dc.frames(whole.channels, whole.frames, scale * bands_.rows(static_cast<int>(rank)), whole.width);
  copy_rows(whole.data() + scale * bands_.begin(static_cast<int>(rank)) * whole.width, whole.plane(), out.data(), out.plane(), out.height,
            whole.width, whole.channels * whole.frames, dc.stream);
  return out;
}

bool DeviceRowSplit::any(const DecodeContext& dc, bool mine) const {
  const float vote = mine ? 1.0f : 0.0f;
  float votes = 0.0f;
  DeviceFrames on_device = dc.frames(1, 1, 1, 1);
  check_cuda(cudaMemcpyAsync(on_device.data(), &vote, kFloat, cudaMemcpyHostToDevice, dc.stream), "cancel vote");
  group_.all_reduce_sum(context(dc), floats(on_device.data(), 1, device_));
  check_cuda(cudaMemcpyAsync(&votes, on_device.data(), kFloat, cudaMemcpyDeviceToHost, dc.stream), "cancel vote");
  check_cuda(cudaStreamSynchronize(dc.stream), "cancel vote");
  return votes > 0.0f;
}

}  // namespace tessel::vae::cuda
