//! Property tests standing in for fuzzing (cargo fuzz needs nightly; these run in CI on stable):
//! config parsing and request routing never panic, and their answers keep their promises.

use proptest::prelude::*;
use tollgate::route::{RouteError, Router};
use tollgate::Config;

const BASE: &str = "[providers.geo]\nupstream = \"https://api.geo.example/v1\"\nrate = 5\nhosts = [\"geo.example\"]\n[providers.geo.regions.eu]\nupstream = \"https://eu.geo.example\"\nrate = 2\n[providers.nominatim]\nupstream = \"http://10.0.0.1:8080\"\nrate = 1\n";

fn router() -> Router {
    Router::new(&Config::from_toml("p.toml", BASE).expect("valid").buckets)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_config_text_is_accepted_or_refused_with_one_line(text in ".{0,400}") {
        if let Err(e) = Config::from_toml("fuzz.toml", &text) {
            let msg = e.to_string();
            prop_assert!(msg.starts_with("fuzz.toml"), "{}", msg);
        }
    }

    #[test]
    fn mutated_valid_configs_never_panic(
        cut in 0usize..BASE.len(),
        insert in "[a-z0-9_=\\[\\].\"\\n -]{0,30}",
    ) {
        let cut = (0..=cut).rev().find(|&i| BASE.is_char_boundary(i)).unwrap_or(0);
        let text = format!("{}{}{}", &BASE[..cut], insert, &BASE[cut..]);
        match Config::from_toml("fuzz.toml", &text) {
            Ok(c) => {
                for b in &c.buckets {
                    prop_assert!(b.limit.rate() > 0.0 && b.limit.capacity() >= 1.0);
                }
            }
            Err(e) => prop_assert!(!e.to_string().contains('\n')),
        }
    }

    #[test]
    fn routing_any_path_yields_a_configured_bucket_and_a_suffix_of_the_path(
        path in "/[a-zA-Z0-9%/._~-]{0,60}",
        region in proptest::option::of("[a-zA-Z0-9-]{0,8}"),
    ) {
        let r = router();
        match r.route(&path, region.as_deref()) {
            Ok(route) => {
                prop_assert!(route.bucket < 3);
                prop_assert!(path.ends_with(route.rest));
                prop_assert!(route.rest.is_empty() || route.rest.starts_with('/'));
            }
            Err(RouteError::HostNotAllowed { .. }) => prop_assert!(false, "base-URL mode never says host"),
            Err(_) => {}
        }
    }

    #[test]
    fn routing_any_host_only_ever_matches_a_configured_one(
        host in "[a-zA-Z0-9.-]{0,30}",
        port in proptest::option::of(any::<u16>()),
    ) {
        let r = router();
        if let Ok(route) = r.route_host(&host, port, "/x", None) {
            let h = host.trim_end_matches('.').to_ascii_lowercase();
            prop_assert!(["api.geo.example", "geo.example", "eu.geo.example", "10.0.0.1"].contains(&h.as_str()), "{}", h);
            prop_assert!(route.absolute);
        }
    }
}
