//! `pilotfish-crdgen [OUT_DIR]`: writes the CustomResourceDefinitions of the Istio kinds,
//! generated from the Rust types, one file per CRD (default `crds/`). Run by
//! `scripts/gen-crds.sh` (`make crds`, `make crds-check`).

use std::path::PathBuf;
use std::process::ExitCode;

use pilotfish_mesh::api::crd;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let out_dir = PathBuf::from(args.next().unwrap_or_else(|| "crds".into()));
    if args.next().is_some() {
        eprintln!("usage: pilotfish-crdgen [OUT_DIR]");
        return ExitCode::from(2);
    }
    if let Err(message) = write_all(&out_dir) {
        eprintln!("pilotfish-crdgen: {message}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn write_all(out_dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    for definition in crd::crds() {
        let path = out_dir.join(crd::file_name(&definition));
        let yaml = crd::to_yaml(&definition)
            .map_err(|e| format!("cannot render {}: {e}", path.display()))?;
        std::fs::write(&path, yaml).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
