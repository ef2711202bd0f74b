"""Writes the torch.save fixtures of tests/it/torch_save.rs without torch (standard library only).

torch.save writes (torch/serialization.py): a zip archive whose entries are stored, not
compressed, under one top-level folder named after the file (`<name>/data.pkl` with the
object pickled at protocol 2, `<name>/byteorder`, `<name>/version`, ...); or, with
`_use_new_zipfile_serialization=False`, the legacy stream of pickles: the magic number, the
protocol version 1001, a dict of system info, the object, then the list of storage keys.

Usage: python3 make.py SNAPSHOT.pickle OUTDIR
"""
import io
import os
import pickle
import sys
import zipfile

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001


def zip_save(obj, path, name, compress=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression=compress) as z:
        z.writestr(name + "/data.pkl", pickle.dumps(obj, protocol=2))
        z.writestr(name + "/byteorder", "little")
        z.writestr(name + "/.format_version", "1")
        z.writestr(name + "/version", "3\n")
        z.writestr(name + "/.data/serialization_id", "0123456789")


def legacy_save(obj, path):
    with open(path, "wb") as f:
        for x in (MAGIC_NUMBER, PROTOCOL_VERSION,
                  dict(protocol_version=PROTOCOL_VERSION, little_endian=True,
                       type_sizes=dict(short=2, int=4, long=8))):
            pickle.dump(x, f, protocol=2)
        pickle.dump(obj, f, protocol=2)
        pickle.dump([], f, protocol=2)  # storage keys: a snapshot has no tensors


def main():
    src, out = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        snap = pickle.load(f)
    os.makedirs(out, exist_ok=True)
    # torch.cuda.memory._snapshot(): the dict; torch.cuda.memory_snapshot(): its segments.
    zip_save(snap, os.path.join(out, "memory_snapshot.pt"), "memory_snapshot")
    zip_save(snap["segments"], os.path.join(out, "segments_list.pth"), "segments_list")
    zip_save(snap, os.path.join(out, "deflated.pt"), "deflated", zipfile.ZIP_DEFLATED)
    legacy_save(snap, os.path.join(out, "legacy.pt"))
    # Refused: a torch.save of a tensor (persistent ids for its storage, a class to load).
    class_pickle = (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nq\x00((X\x07\x00\x00\x00storageq\x01"
                    b"ctorch\nFloatStorage\nq\x02X\x01\x00\x00\x000q\x03X\x03\x00\x00\x00cpuq\x04K\x04tq\x05Q"
                    b"K\x00K\x04\x85q\x06K\x01\x85q\x07\x89ccollections\nOrderedDict\nq\x08)Rq\ttq\nRq\x0b.")
    with zipfile.ZipFile(os.path.join(out, "tensor.pt"), "w") as z:
        z.writestr("tensor/data.pkl", class_pickle)
        z.writestr("tensor/data/0", b"\x00" * 16)
        z.writestr("tensor/version", "3\n")
    with zipfile.ZipFile(os.path.join(out, "no_data_pkl.zip"), "w") as z:
        z.writestr("model/weights.bin", b"\x00" * 16)
        z.writestr("README.txt", "not a torch.save archive")


if __name__ == "__main__":
    main()
