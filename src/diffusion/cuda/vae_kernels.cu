// The Wan VAE's element-wise kernels (see vae_kernels.h). Element kernels use grid-stride
// loops; the channel reductions (RMS norm, softmax over keys) give each position a thread (the
// softmax several), whose channel loop reads consecutive positions across a warp (the channel
// stride is the plane), so the loads coalesce without a transpose. Copies of whole frames are
// cudaMemcpy2DAsync, one row per channel.
#include "cuda/vae_kernels.h"

#include <algorithm>
#include <cmath>

#include "cuda/grid_stride.h"
#include "tessel/core/error.h"

namespace tessel::vae::cuda {
namespace {

using diffusion::cuda::grid_blocks;
using diffusion::cuda::kGridThreads;

__global__ void denormalize_kernel(const float* in, const float* mean, const float* inverse_std, float* out, int64_t channels,
                                   int64_t per_channel) {
  TESSEL_GRID_STRIDE(i, channels * per_channel) {
    const int64_t c = i / per_channel;
    out[i] = in[i] / inverse_std[c] + mean[c];
  }
}

__global__ void rms_norm_kernel(const float* x, float* y, const float* gamma, int64_t channels, int64_t pixels, bool silu) {
  const float scale = sqrtf(static_cast<float>(channels));
  TESSEL_GRID_STRIDE(p, pixels) {
    float sum = 0.0f;
    for (int64_t c = 0; c < channels; ++c) {
      const float v = x[c * pixels + p];
      sum = fmaf(v, v, sum);
    }
    const float factor = scale / fmaxf(sqrtf(sum), 1e-12f);
    for (int64_t c = 0; c < channels; ++c) {
      const float v = x[c * pixels + p] * factor * gamma[c];
      y[c * pixels + p] = silu ? v / (1.0f + expf(-v)) : v;
    }
  }
}

// One channel per grid row: no division per element.
__global__ void add_bias_kernel(float* y, const float* bias, const float* residual, int64_t pixels) {
  const int64_t offset = blockIdx.y * pixels;
  const float b = bias[blockIdx.y];
  TESSEL_GRID_STRIDE(p, pixels) {
    float v = y[offset + p] + b;
    if (residual != nullptr) v += residual[offset + p];
    y[offset + p] = v;
  }
}

__global__ void interleave_frames_kernel(const float* y, float* out, int64_t channels, int64_t frames, int64_t plane) {
  const int64_t out_frames = 2 * frames;
  TESSEL_GRID_STRIDE(i, channels * out_frames * plane) {
    const int64_t c = i / (out_frames * plane), rest = i % (out_frames * plane), f = rest / plane, p = rest % plane;
    const int64_t half = f % 2, t = f / 2;
    out[i] = y[((half * channels + c) * frames + t) * plane + p];
  }
}

__global__ void upsample_nearest_2x_kernel(const float* x, float* out, int64_t images, int64_t height, int64_t width) {
  const int64_t out_height = 2 * height, out_width = 2 * width, out_plane = out_height * out_width;
  TESSEL_GRID_STRIDE(i, images * out_plane) {
    const int64_t image = i / out_plane, rest = i % out_plane, y = rest / out_width, x_out = rest % out_width;
    out[i] = x[(image * height + y / 2) * width + x_out / 2];
  }
}

constexpr int kTile = 32;

__global__ void transpose_kernel(const float* in, float* out, int64_t rows, int64_t cols) {
  __shared__ float tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed read
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile, col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
    const int64_t r = row0 + dy, c = col0 + threadIdx.x;
    if (r < rows && c < cols) tile[dy][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
    const int64_t c = col0 + dy, r = row0 + threadIdx.x;
    if (r < rows && c < cols) out[c * rows + r] = tile[threadIdx.x][dy];
  }
}

// A block owns kSoftmaxColumns queries (consecutive, so each row of the tile is one coalesced
// load) and splits their keys over kSoftmaxRows rows of threads: pass 1 keeps each thread's
// running maximum and sum (rescaled as the maximum grows), the block combines them, pass 2 writes
// the probabilities.
constexpr int kSoftmaxColumns = 32, kSoftmaxRows = 8;

__global__ void softmax_columns_kernel(float* scores, int64_t keys, int64_t queries, float scale) {
  __shared__ float row_max[kSoftmaxRows][kSoftmaxColumns], row_sum[kSoftmaxRows][kSoftmaxColumns];
  const int64_t q = static_cast<int64_t>(blockIdx.x) * kSoftmaxColumns + threadIdx.x;
  float largest = -INFINITY, sum = 0.0f;
  if (q < queries)
    for (int64_t k = threadIdx.y; k < keys; k += kSoftmaxRows) {
      const float v = scores[k * queries + q];
      if (v > largest) {
        sum = sum * expf((largest - v) * scale) + 1.0f;
        largest = v;
      } else {
        sum += expf((v - largest) * scale);
      }
    }
  row_max[threadIdx.y][threadIdx.x] = largest;
  row_sum[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  float column_max = -INFINITY;
  for (int r = 0; r < kSoftmaxRows; ++r) column_max = fmaxf(column_max, row_max[r][threadIdx.x]);
  float column_sum = 0.0f;
  for (int r = 0; r < kSoftmaxRows; ++r)
    if (row_sum[r][threadIdx.x] > 0.0f) column_sum += row_sum[r][threadIdx.x] * expf((row_max[r][threadIdx.x] - column_max) * scale);
  if (q >= queries) return;
  const float inverse = 1.0f / column_sum;
  for (int64_t k = threadIdx.y; k < keys; k += kSoftmaxRows) {
    float& v = scores[k * queries + q];
    v = expf((v - column_max) * scale) * inverse;
  }
}

__global__ void add_duplicate_upsample_kernel(const float* in, int64_t in_frames, int64_t height, int64_t width, float* x,
                                              int64_t out_channels, int64_t out_frames, int64_t time_factor, int64_t dropped,
                                              int64_t repeats) {
  const int64_t out_width = 2 * width, out_plane = 4 * height * width;
  TESSEL_GRID_STRIDE(i, out_channels * out_frames * out_plane) {
    const int64_t o = i / (out_frames * out_plane), rest = i % (out_frames * out_plane);
    const int64_t frame = rest / out_plane + dropped, pixel = rest % out_plane, y = pixel / out_width, x_out = pixel % out_width;
    const int64_t t = frame / time_factor, a = frame % time_factor;
    const int64_t channel = (o * time_factor * 4 + (a * 2 + y % 2) * 2 + x_out % 2) / repeats;
    x[i] += in[((channel * in_frames + t) * height + y / 2) * width + x_out / 2];
  }
}

__global__ void unpatchify_clamp_into_kernel(const float* decoded, float* video, int64_t channels, int64_t frames,
                                             int64_t video_frames, int64_t first, int64_t height, int64_t width, int64_t patch) {
  const int64_t out_width = patch * width, out_plane = patch * height * out_width, per_channel = frames * out_plane;
  TESSEL_GRID_STRIDE(i, channels * per_channel) {
    const int64_t c = i / per_channel, rest = i % per_channel, f = rest / out_plane, pixel = rest % out_plane;
    const int64_t y = pixel / out_width, x = pixel % out_width;
    const int64_t source = (c * patch + x % patch) * patch + y % patch;
    const float v = decoded[((source * frames + f) * height + y / patch) * width + x / patch];
    video[(c * video_frames + first) * out_plane + rest] = fminf(fmaxf(v, -1.0f), 1.0f);
  }
}

__global__ void patchify_frames_kernel(const float* video, int64_t channels, int64_t frames, int64_t first, int64_t count,
                                       int64_t height, int64_t width, int64_t patch, float* out) {
  const int64_t plane = height * width, per_channel = count * plane;
  const int64_t out_height = height / patch, out_width = width / patch;
  TESSEL_GRID_STRIDE(i, channels * per_channel) {
    const int64_t c = i / per_channel, rest = i % per_channel, f = rest / plane, pixel = rest % plane;
    const int64_t y = pixel / width, x = pixel % width;
    const int64_t channel = (c * patch + x % patch) * patch + y % patch;
    out[((channel * count + f) * out_height + y / patch) * out_width + x / patch] = video[(c * frames + first) * plane + rest];
  }
}

__global__ void pad_bottom_right_kernel(const float* x, float* out, int64_t images, int64_t height, int64_t width) {
  const int64_t out_width = width + 1, out_plane = (height + 1) * out_width;
  TESSEL_GRID_STRIDE(i, images * out_plane) {
    const int64_t image = i / out_plane, rest = i % out_plane, y = rest / out_width, x_out = rest % out_width;
    out[i] = y < height && x_out < width ? x[(image * height + y) * width + x_out] : 0.0f;
  }
}

__global__ void add_average_downsample_kernel(const float* in, int64_t in_frames, int64_t height, int64_t width, float* x,
                                              int64_t out_channels, int64_t out_frames, int64_t time_factor, int64_t space_factor,
                                              int64_t padded, int64_t group) {
  const int64_t out_height = height / space_factor, out_width = width / space_factor, out_plane = out_height * out_width;
  const int64_t area = space_factor * space_factor, factor = time_factor * area;
  TESSEL_GRID_STRIDE(i, out_channels * out_frames * out_plane) {
    const int64_t o = i / (out_frames * out_plane), rest = i % (out_frames * out_plane);
    const int64_t t = rest / out_plane, pixel = rest % out_plane, y = pixel / out_width, x_out = pixel % out_width;
    // The CPU's order of summation, so both round alike.
    float sum = 0.0f;
    for (int64_t v = o * group; v < (o + 1) * group; ++v) {
      const int64_t within = v % factor, frame = t * time_factor + within / area - padded;
      if (frame < 0) continue;  // the zero frames diffusers pads the front with
      const int64_t row = y * space_factor + within / space_factor % space_factor, column = x_out * space_factor + within % space_factor;
      sum += in[((v / factor * in_frames + frame) * height + row) * width + column];
    }
    x[i] += sum / static_cast<float>(group);
  }
}

}  // namespace

void launch_patchify_frames(const float* video, int64_t channels, int64_t frames, int64_t first, int64_t count, int64_t height,
                            int64_t width, int64_t patch, float* out, cudaStream_t stream) {
  patchify_frames_kernel<<<grid_blocks(channels * count * height * width), kGridThreads, 0, stream>>>(video, channels, frames, first, count,
                                                                                                height, width, patch, out);
}

void launch_pad_bottom_right(const float* x, float* out, int64_t images, int64_t height, int64_t width, cudaStream_t stream) {
  pad_bottom_right_kernel<<<grid_blocks(images * (height + 1) * (width + 1)), kGridThreads, 0, stream>>>(x, out, images, height, width);
}

void launch_add_average_downsample(const float* in, int64_t in_channels, int64_t in_frames, int64_t height, int64_t width, float* x,
                                   int64_t out_channels, int64_t time_factor, int64_t space_factor, cudaStream_t stream) {
  const int64_t padded = (time_factor - in_frames % time_factor) % time_factor, out_frames = (in_frames + padded) / time_factor;
  const int64_t group = in_channels * time_factor * space_factor * space_factor / out_channels;
  const int64_t out_pixels = out_frames * (height / space_factor) * (width / space_factor);
  add_average_downsample_kernel<<<grid_blocks(out_channels * out_pixels), kGridThreads, 0, stream>>>(
      in, in_frames, height, width, x, out_channels, out_frames, time_factor, space_factor, padded, group);
}

void launch_denormalize(const float* in, const float* mean, const float* inverse_std, float* out, int64_t channels,
                        int64_t per_channel, cudaStream_t stream) {
  denormalize_kernel<<<grid_blocks(channels * per_channel), kGridThreads, 0, stream>>>(in, mean, inverse_std, out, channels, per_channel);
}

void launch_rms_norm(const float* x, float* y, const float* gamma, int64_t channels, int64_t pixels, bool silu,
                     cudaStream_t stream) {
  rms_norm_kernel<<<grid_blocks(pixels), kGridThreads, 0, stream>>>(x, y, gamma, channels, pixels, silu);
}

void launch_add_bias(float* y, const float* bias, const float* residual, int64_t channels, int64_t pixels, cudaStream_t stream) {
  // Enough blocks per channel to fill the device however few the channels, at most 1024.
  const dim3 grid(std::min(grid_blocks(pixels), 1024u), static_cast<unsigned>(channels));
  add_bias_kernel<<<grid, kGridThreads, 0, stream>>>(y, bias, residual, pixels);
}

void launch_copy_frames(const float* src, int64_t src_frames, int64_t src_first, float* dst, int64_t dst_frames,
                        int64_t dst_first, int64_t count, int64_t channels, int64_t plane, cudaStream_t stream) {
  if (count == 0) return;
  // One row per channel: a run of count * plane values at each side's pitch of a channel's frames.
  const size_t row = static_cast<size_t>(count * plane) * sizeof(float), dst_pitch = static_cast<size_t>(dst_frames * plane) * sizeof(float);
  float* first = dst + dst_first * plane;
  const cudaError_t status =
      src == nullptr ? cudaMemset2DAsync(first, dst_pitch, 0, row, static_cast<size_t>(channels), stream)
                     : cudaMemcpy2DAsync(first, dst_pitch, src + src_first * plane, static_cast<size_t>(src_frames * plane) * sizeof(float), row,
                                         static_cast<size_t>(channels), cudaMemcpyDeviceToDevice, stream);
  check_cuda(status, "a copy of frames");
}

void launch_interleave_frames(const float* y, float* out, int64_t channels, int64_t frames, int64_t plane, cudaStream_t stream) {
  interleave_frames_kernel<<<grid_blocks(channels * 2 * frames * plane), kGridThreads, 0, stream>>>(y, out, channels, frames, plane);
}

void launch_upsample_nearest_2x(const float* x, float* out, int64_t images, int64_t height, int64_t width, cudaStream_t stream) {
  upsample_nearest_2x_kernel<<<grid_blocks(images * 4 * height * width), kGridThreads, 0, stream>>>(x, out, images, height, width);
}

void launch_transpose(const float* in, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>((rows + kTile - 1) / kTile));
  transpose_kernel<<<grid, dim3(kTile, 8), 0, stream>>>(in, out, rows, cols);
}

void launch_softmax_columns(float* scores, int64_t keys, int64_t queries, float scale, cudaStream_t stream) {
  const unsigned grid = static_cast<unsigned>(std::max<int64_t>(1, (queries + kSoftmaxColumns - 1) / kSoftmaxColumns));
  softmax_columns_kernel<<<grid, dim3(kSoftmaxColumns, kSoftmaxRows), 0, stream>>>(scores, keys, queries, scale);
}

void launch_add_duplicate_upsample(const float* in, int64_t in_channels, int64_t in_frames, int64_t height, int64_t width, float* x,
                                   int64_t out_channels, int64_t time_factor, bool first_chunk, cudaStream_t stream) {
  const int64_t dropped = first_chunk ? time_factor - 1 : 0, out_frames = in_frames * time_factor - dropped;
  const int64_t repeats = out_channels * time_factor * 4 / in_channels;
  add_duplicate_upsample_kernel<<<grid_blocks(out_channels * out_frames * 4 * height * width), kGridThreads, 0, stream>>>(
      in, in_frames, height, width, x, out_channels, out_frames, time_factor, dropped, repeats);
}

void launch_unpatchify_clamp_into(const float* decoded, float* video, int64_t channels, int64_t frames, int64_t video_frames,
                                  int64_t first, int64_t height, int64_t width, int64_t patch, cudaStream_t stream) {
  unpatchify_clamp_into_kernel<<<grid_blocks(channels * frames * patch * patch * height * width), kGridThreads, 0, stream>>>(
      decoded, video, channels, frames, video_frames, first, height, width, patch);
}

void check_launch(const char* what) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) throw Error(detail::concat("Wan VAE CUDA kernel ", what, " failed to launch: ", cudaGetErrorString(status)));
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw Error(detail::concat("Wan VAE on CUDA: ", what, " failed: ", cudaGetErrorString(status)));
}

}  // namespace tessel::vae::cuda
