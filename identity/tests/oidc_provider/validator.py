"""The claims the test provider releases about a user."""

from oauth2_provider.oauth2_validators import OAuth2Validator


class ClaimsValidator(OAuth2Validator):
    """Standard claims from the user, and `groups`: the names of their Django groups. The groups
    go with every token, as Keycloak's group mapper on a client's own scope does, and into the ID
    token only (Entra ID's and Okta's org server's way), not the userinfo answer."""

    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "openid"}

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "name": user.get_full_name(),
            "given_name": user.first_name,
            "family_name": user.last_name,
            "email": user.email,
            "email_verified": bool(user.email),
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }

    # `prompt=none` (the dashboard's session renewal). django-oauth-toolkit leaves these to the
    # validator: its view has already sent a browser without a session here back with
    # login_required, and the dashboard is an in-house client that asks for no consent.
    def validate_silent_login(self, request):
        return True

    def validate_silent_authorization(self, request):
        return True

    def get_userinfo_claims(self, request):
        claims = super().get_userinfo_claims(request)
        claims.pop("groups", None)
        return claims
