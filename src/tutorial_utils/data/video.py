"""Video encoding and decoding (PyAV): h264/yuv420p mp4 files, one per camera and episode.

``av`` is imported inside the functions that need them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from tutorial_utils.errors import DatasetError
from tutorial_utils.io import atomic_path

#: Video encoding: h264 in yuv420p is what every LeRobot 0.3.x video backend decodes.
VIDEO_CODEC = "libx264"
VIDEO_CODEC_NAME = "h264"
VIDEO_PIX_FMT = "yuv420p"


# --------------------------------------------------------------------------------------
# Video encoding / decoding (PyAV)
# --------------------------------------------------------------------------------------


def encode_video(
    path: str | os.PathLike,
    frames: np.ndarray,
    fps: int,
    *,
    crf: int = 23,
    preset: str = "veryfast",
    gop: int | None = None,
) -> Path:
    """Write (T,H,W,3) uint8 frames as an h264/yuv420p mp4, atomically. Frame i has pts i/fps."""
    import av

    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"video frames must be (T,H,W,3) uint8, got {frames.shape} {frames.dtype}")
    t, h, w, _ = frames.shape
    if h % 2 or w % 2:
        raise ValueError(f"h264 yuv420p needs even frame sizes, got {h}x{w}")
    path = Path(path)
    with atomic_path(path, suffix=".mp4") as tmp:
        with av.open(str(tmp), "w", format="mp4") as container:
            stream = container.add_stream(VIDEO_CODEC, rate=int(fps))
            stream.width, stream.height, stream.pix_fmt = w, h, VIDEO_PIX_FMT
            stream.thread_count = 1
            stream.options = {"crf": str(crf), "preset": preset, "g": str(gop or int(fps)), "bf": "0"}
            for frame in frames:
                vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")
                for packet in stream.encode(vf):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
    return path


def probe_video(path: str | os.PathLike) -> dict:
    """Open an mp4 and read its header: frames, size, codec. Raises DatasetError if unreadable."""
    import av

    path = Path(path)
    if not path.is_file():
        raise DatasetError(
            path,
            None,
            "video file is missing",
            "re-download or re-record this episode (or delete the dataset and regenerate it)",
        )
    try:
        with av.open(str(path)) as c:
            if not c.streams.video:
                raise DatasetError(path, None, "the file has no video stream", "re-encode the episode")
            s = c.streams.video[0]
            return {
                "frames": int(s.frames),
                "width": s.codec_context.width,
                "height": s.codec_context.height,
                "codec": s.codec_context.name,
            }
    except DatasetError:
        raise
    except Exception as exc:  # av.error.InvalidDataError and friends
        raise DatasetError(
            path,
            None,
            f"cannot be opened as a video ({type(exc).__name__}: {exc}); "
            "it is probably truncated (an interrupted download or write)",
            "re-download the file, or re-record the episode",
        ) from None


#: Decoder caches inherited through fork (see ``reader.LeRobotDataset._check_pid``); never touched.
INHERITED_DECODERS: list = []


class EpisodeVideo:
    """Decode one episode's video on demand and keep the decoded frames.

    Frames just ahead of the decoder are reached by decoding forward; a frame far ahead (or
    behind) by seeking to the keyframe before it first, so random access costs at most about
    one GOP of decoding (the writer uses a GOP of one second). Frame numbers come from the
    packets' timestamps, so they match the parquet's ``frame_index``.
    """

    def __init__(self, path: Path, expected: int, fps: int):
        self.path, self.expected, self.fps = path, expected, fps
        self.container = None
        self._open()
        self.time_base = float(self.stream.time_base)
        self.start = self.stream.start_time or 0
        self.frames: dict[int, Any] = {}  # decoded av.VideoFrame (yuv), or its RGB array once asked for
        # frames asked for at another size (a training's model size): resized once, not every epoch
        self.resized: dict[tuple[int, int], np.ndarray] = {}
        self.nbytes = 0
        self._iter = None
        self._next = 0  # frame number the iterator produces next
        self.window = max(int(fps), 8)  # decode forward rather than seek when this close

    def _open(self) -> None:
        import av

        try:
            self.container = av.open(str(self.path))
            self.stream = self.container.streams.video[0]
            self.stream.thread_type = "NONE"
        except Exception as exc:
            self.container = None
            raise DatasetError(
                self.path,
                None,
                f"cannot be opened as a video ({type(exc).__name__}: {exc})",
                "re-download the file, or re-record the episode; "
                "`python -m tutorial_utils dataset validate ROOT --deep` lists every bad file",
            ) from None
        self._iter = None

    def _index(self, frame) -> int:
        if frame.pts is None:
            return self._next
        return int(round((frame.pts - self.start) * self.time_base * self.fps))

    def _fail(self, k: int, exc: BaseException | None) -> DatasetError:
        self.close()
        if exc is None:
            return DatasetError(
                self.path,
                f"frame {k}",
                f"the video ends before frame {k} but the parquet has {self.expected} rows",
                "re-encode or re-record this episode",
            )
        return DatasetError(
            self.path,
            f"frame {k}",
            f"decoding failed ({type(exc).__name__}: {exc}); the file is probably truncated",
            "re-download the file, or re-record the episode",
        )

    def get(self, k: int, size: int | None = None) -> np.ndarray:
        """Frame ``k`` as (H, W, 3) uint8 RGB; with ``size``, resized to ``size`` x ``size`` by
        :func:`tutorial_utils.data.images.resize` and kept at that size (the full-size RGB is then
        not kept: the decoded frame is half its bytes), so a training that reads each frame once per
        epoch resizes it once."""
        size = None if size is None else int(size)
        if (k, size) in self.resized:
            return self.resized[(k, size)]
        got = self._decoded(k)
        rgb = got if isinstance(got, np.ndarray) else _rgb(got)
        if size is None or rgb.shape[:2] == (size, size):
            if rgb is not got:
                self.frames[k] = rgb
                self.nbytes += rgb.nbytes // 2  # yuv420 was counted as half of rgb
            return rgb
        from tutorial_utils.data.images import resize

        small = self.resized[(k, size)] = resize(rgb, size)
        self.nbytes += small.nbytes
        return small

    def _decoded(self, k: int):
        got = self.frames.get(k)
        if got is not None:
            return got
        if self.container is None:
            if len(self.frames) >= self.expected:  # everything was decoded and k is not there
                raise self._fail(k, None)
            self._open()  # closed to save file handles: reopen
        if self._iter is None or not (self._next <= k <= self._next + self.window):
            if k > 0 and (self._iter is not None or k > self.window):
                target = int(k / self.fps / self.time_base) + self.start
                try:
                    self.container.seek(target, stream=self.stream, backward=True, any_frame=False)
                except Exception as exc:
                    raise self._fail(k, exc) from None
            elif self._iter is not None:
                self.container.seek(self.start, stream=self.stream, backward=True, any_frame=False)
            self._iter = self.container.decode(self.stream)
            self._next = -1
        while True:
            try:
                frame = next(self._iter)
            except StopIteration:
                raise self._fail(k, None) from None
            except Exception as exc:
                raise self._fail(k, exc) from None
            idx = self._index(frame)
            self._next = idx + 1
            if idx not in self.frames:
                self.frames[idx] = frame
                self.nbytes += frame.width * frame.height * 3 // 2
            if len(self.frames) >= self.expected:
                self.close()
            if idx >= k:
                break
        got = self.frames.get(k)
        if got is None:
            raise self._fail(k, None)
        return got

    def close(self) -> None:
        c = getattr(self, "container", None)
        if c is not None:
            try:
                c.close()
            except Exception:
                pass
            self.container = None
            self._iter = None


_RGB: dict[int, Any] = {}


def _rgb(frame) -> np.ndarray:
    """A decoded frame as (H,W,3) uint8 RGB, through one reusable converter per process
    (much faster than ``frame.to_ndarray(format="rgb24")``, which builds a new swscale
    context for every frame)."""
    pid = os.getpid()
    conv = _RGB.get(pid)
    if conv is None:
        from av.video.reformatter import VideoReformatter

        # (a converter inherited through fork stays referenced and unused, like decoders)
        conv = _RGB[pid] = VideoReformatter()
    return conv.reformat(frame, format="rgb24").to_ndarray()


def decode_all_frames(path: str | os.PathLike) -> np.ndarray:
    """All frames of an mp4 as (T,H,W,3) uint8 (the book's and the tests' simple path)."""
    import av

    with av.open(str(path)) as c:
        return np.stack([_rgb(f) for f in c.decode(video=0)])


def decode_all_frames_checked(path: str | os.PathLike) -> np.ndarray:
    """:func:`decode_all_frames`, with any decoding failure (a truncated file) raised as a
    :class:`DatasetError` naming the file."""
    try:
        return decode_all_frames(path)
    except Exception as exc:
        raise DatasetError(
            path,
            None,
            f"decoding failed ({type(exc).__name__}: {exc}); the file is probably truncated",
            "re-download the file, or re-record the episode",
        ) from None
